//! Reads from the filer: a handle's window of recent bytes and the stream that feeds it, so
//! that a file read whole (`cat`, `cp`, `rsync`) is one ranged read of the filer, and a read at
//! a fresh offset one block.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fuser::Errno;
use futures::StreamExt;

use tidemark_core::{ByteRange, ByteStream, Error, Filer};

use crate::ops::{TidemarkFs, errno};

/// What a read at a fresh offset (not 0, not continuing the last one) fetches: one ranged read,
/// so that random access does not stream the file.
const BLOCK: u64 = 4 << 20;
/// Recent bytes a reader keeps: the kernel sends its read-ahead requests out of order, on
/// several threads.
const WINDOW: u64 = 16 << 20;
/// How far past what it has a read may land and still continue the stream (the skipped bytes
/// are read and dropped) rather than start a new one.
const SKIP: u64 = 8 << 20;
/// The batches of frames a stream holds ahead of the reader, and the bytes in one: the task
/// that reads the filer's stream stays at most this far ahead. Frames are kept as they came
/// (no copy into pieces: a fresh buffer per piece cost its page faults and zeroing, a sixth of
/// the mount's CPU in a cold read) and a read's answer is gathered from them once, into a
/// buffer its FUSE thread reuses (`GATHERED`).
const BATCHES_AHEAD: usize = 16;
const BATCH: usize = 1 << 20;

/// A handle's reads from the filer: a window of recent bytes and, once reads continue where
/// the last one ended, one stream to the end of the file that a task reads ahead of the
/// reader. A whole-file read (`cat`, `cp`, `rsync`) is thus one ranged read of the filer (and
/// one GET of the bucket when the filer's cache misses), not one per block.
#[derive(Default)]
pub(crate) struct Reader {
    /// Recent bytes, contiguous, oldest first.
    window: std::collections::VecDeque<Bytes>,
    /// The file offset of the window's first byte, and just past its last.
    start: u64,
    end: u64,
    /// The stream from `end` on; `None` while the reader holds one block.
    stream: Option<Stream>,
}

/// The frames of a stream from the filer, in batches, and the task that reads them ahead
/// (stopped when the stream is dropped).
struct Stream {
    rx: tokio::sync::mpsc::Receiver<Result<Vec<Bytes>, Errno>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Reader {
    fn held(&self) -> u64 {
        self.end - self.start
    }

    fn push(&mut self, b: Bytes, keep_from: u64) {
        self.end += b.len() as u64;
        self.window.push_back(b);
        // Old bytes go, but never those the read in hand still needs.
        while self.held() > WINDOW {
            let first = self.window.front().map_or(0, |f| f.len() as u64);
            if self.start + first > keep_from {
                break;
            }
            self.window.pop_front();
            self.start += first;
        }
    }

    /// Bytes `from..to` of what it holds: a slice of one frame where they lie in one, else
    /// gathered from the frames they span into `GATHERED`.
    fn bytes(&self, from: u64, to: u64) -> Answer {
        let mut at = self.start;
        let mut gathering = false;
        for b in &self.window {
            let (lo, hi) = (at, at + b.len() as u64);
            if hi > from && lo < to {
                let part = (from.max(lo) - lo) as usize..(to.min(hi) - lo) as usize;
                if !gathering && lo <= from && to <= hi {
                    return Answer::Slice(b.slice(part));
                }
                GATHERED.with_borrow_mut(|g| {
                    if !gathering {
                        g.clear();
                    }
                    g.extend_from_slice(&b[part]);
                });
                gathering = true;
            }
            at = hi;
            if at >= to {
                break;
            }
        }
        if gathering { Answer::Gathered } else { Answer::Slice(Bytes::new()) }
    }
}

/// A read's answer: bytes of their own, or gathered into this FUSE thread's `GATHERED`.
pub enum Answer {
    Slice(Bytes),
    Gathered,
}

thread_local! {
    /// Where a FUSE thread gathers a read's answer (from several frames, or from a file on
    /// this machine): reused, so its pages are faulted in once, not for every read.
    pub(crate) static GATHERED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Answer {
    /// The bytes, owned (the tests, and a copy between files).
    pub fn to_vec(&self) -> Vec<u8> {
        match self {
            Answer::Slice(b) => b.to_vec(),
            Answer::Gathered => GATHERED.with_borrow(|g| g.clone()),
        }
    }
}

impl TidemarkFs {
    /// Reads `size` bytes at `offset` of the file at `path` from the filer, through the handle's
    /// reader (`Reader`), which continues its stream when the read is at or a little past what
    /// it holds, and starts afresh otherwise: a stream to the end for a read near the start,
    /// one block elsewhere (a stream follows if the next read continues it).
    pub(crate) fn read_from_filer(
        &self,
        path: &str,
        reader: &mut Option<Reader>,
        changed: &Arc<AtomicBool>,
        offset: u64,
        size: u32,
    ) -> Result<Answer, Errno> {
        let e = self.stat(path)?;
        let end = (offset + size as u64).min(e.size);
        if offset >= end {
            return Ok(Answer::Slice(Bytes::new()));
        }
        let fits = |r: &Reader| offset >= r.start && (end <= r.end || offset <= r.end + SKIP);
        if !reader.as_ref().is_some_and(fits) {
            *reader = None;
            // A read near the start opens a stream from 0: a file is most often read whole,
            // and the kernel's read-ahead may ask for a later offset before the first one.
            let r = if offset <= SKIP {
                self.stream_from(path, changed, Reader::default())
            } else {
                self.counters.reads.fetch_add(1, Ordering::Relaxed);
                let range = ByteRange { offset, length: Some(BLOCK.min(e.size - offset)) };
                let block = self.rt.block_on(read_range(self.filer_read(path, changed, range)))?;
                let end = offset + block.len() as u64;
                Reader { window: [block].into(), start: offset, end, stream: None }
            };
            *reader = Some(r);
        }
        if reader.as_ref().is_some_and(|r| end > r.end && r.stream.is_none()) {
            let held = reader.take().unwrap_or_default();
            *reader = Some(self.stream_from(path, changed, held));
        }
        let Some(r) = reader.as_mut() else { return Err(Errno::EIO) };
        while r.end < end {
            let Some(Stream { rx, .. }) = r.stream.as_mut() else { break };
            // The timer is made inside the runtime: FUSE's threads are not its.
            let timeout = self.opts.timeout;
            match self.rt.block_on(async { tokio::time::timeout(timeout, rx.recv()).await }) {
                Ok(Some(Ok(frames))) => {
                    for b in frames {
                        r.push(b, offset);
                    }
                }
                // The end of the file as the filer has it (it may have shrunk since the stat).
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    *reader = None;
                    return Err(e);
                }
                Err(_) => {
                    tracing::warn!(path, "read: the filer sent nothing for {:?}", self.opts.timeout);
                    *reader = None;
                    return Err(Errno::EIO);
                }
            }
        }
        Ok(r.bytes(offset, end.min(r.end)))
    }

    /// `held` with a stream from its end to the end of the file, read ahead by a task.
    fn stream_from(&self, path: &str, changed: &Arc<AtomicBool>, mut held: Reader) -> Reader {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::mpsc::channel(BATCHES_AHEAD);
        let range = ByteRange { offset: held.end, length: None };
        let task = self.rt.spawn(pump(self.filer_read(path, changed, range), tx));
        held.stream = Some(Stream { rx, task });
        held
    }

    /// A read of `range` of the file at `path` from the filer.
    pub(crate) fn filer_read(&self, path: &str, changed: &Arc<AtomicBool>, range: ByteRange) -> FilerRead {
        FilerRead::new(self.filer.clone(), path.to_string(), range, self.opts.timeout, changed.clone())
    }
}

/// Up to `size` bytes of `f` at `offset` (fewer at its end), into `buf` (whose capacity is
/// reused: a fresh zeroed buffer per read was a page fault and a zeroing per page read).
pub(crate) fn read_file_at(f: &std::fs::File, offset: u64, size: u32, buf: &mut Vec<u8>) -> std::io::Result<()> {
    buf.resize(size as usize, 0);
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(())
}

/// How a read of the filer failed (`None`: it did not answer in time), logged, as an errno.
pub(crate) fn read_failed(p: &str, timeout: Duration, e: Option<&Error>) -> Errno {
    match e {
        Some(e) => {
            tracing::warn!(error = %e, path = p, "read failed");
            errno(e)
        }
        None => {
            tracing::warn!(path = p, "read: the filer did not answer within {timeout:?}");
            Errno::EIO
        }
    }
}

/// A read of the filer's file at `p` from `pos` to `end` (`None`: the file's end). The filer's
/// client resumes a stream that breaks where it broke, on the same version
/// ([`Filer::read`]); when the file changed before it could, this handle's reads fail from then
/// on (`changed`). A filer that sends nothing for the whole timeout fails the read.
pub(crate) struct FilerRead {
    filer: Arc<dyn Filer>,
    p: String,
    pos: u64,
    end: Option<u64>,
    timeout: Duration,
    /// Set when the file changed mid-read: the handle's reads fail from then on.
    changed: Arc<AtomicBool>,
    stream: Option<ByteStream>,
}

impl FilerRead {
    fn new(filer: Arc<dyn Filer>, p: String, range: ByteRange, timeout: Duration, changed: Arc<AtomicBool>) -> Self {
        let end = range.length.map(|n| range.offset.saturating_add(n));
        FilerRead { filer, p, pos: range.offset, end, timeout, changed, stream: None }
    }

    /// Opens the stream from `pos`, within the timeout.
    async fn open(&mut self) -> Result<ByteStream, Errno> {
        if self.changed.load(Ordering::Relaxed) {
            return Err(Errno::EIO);
        }
        let range = ByteRange { offset: self.pos, length: self.end.map(|e| e - self.pos) };
        match tokio::time::timeout(self.timeout, self.filer.read(&self.p, Some(range))).await {
            Ok(Ok((_, stream))) => Ok(stream),
            Ok(Err(e)) => Err(read_failed(&self.p, self.timeout, Some(&e))),
            Err(_) => Err(read_failed(&self.p, self.timeout, None)),
        }
    }

    /// The next bytes; `None` at the end.
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>, Errno> {
        if self.stream.is_none() {
            self.stream = Some(self.open().await?);
        }
        let Some(stream) = self.stream.as_mut() else { return Err(Errno::EIO) };
        match tokio::time::timeout(self.timeout, stream.next()).await {
            Ok(Some(Ok(b))) => {
                self.pos += b.len() as u64;
                Ok(Some(b))
            }
            Ok(None) => Ok(None),
            Ok(Some(Err(e))) => {
                if tidemark_core::changed_mid_read(&e) {
                    self.changed.store(true, Ordering::Relaxed);
                }
                Err(read_failed(&self.p, self.timeout, Some(&Error::internal(e.to_string()))))
            }
            Err(_) => Err(read_failed(&self.p, self.timeout, None)),
        }
    }
}

/// A ranged read, whole.
pub(crate) async fn read_range(mut read: FilerRead) -> Result<Bytes, Errno> {
    let mut buf = BytesMut::with_capacity(read.end.map_or(BLOCK, |e| e - read.pos) as usize);
    while let Some(b) = read.next().await? {
        buf.extend_from_slice(&b);
    }
    Ok(buf.freeze())
}

/// Reads `read` into `tx`, its frames in batches of about
/// `BATCH` bytes, until the end, an error (sent on, after the bytes before it) or the reader
/// going away.
async fn pump(mut read: FilerRead, tx: tokio::sync::mpsc::Sender<Result<Vec<Bytes>, Errno>>) {
    let (mut batch, mut bytes) = (Vec::new(), 0);
    loop {
        let frame = read.next().await;
        if let Ok(Some(b)) = &frame {
            bytes += b.len();
            batch.push(b.clone());
        }
        let full = bytes >= BATCH || !matches!(frame, Ok(Some(_)));
        if full && !batch.is_empty() {
            bytes = 0;
            if tx.send(Ok(std::mem::take(&mut batch))).await.is_err() {
                return;
            }
        }
        match frame {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(r: &Reader, from: u64, to: u64) -> (bool, Vec<u8>) {
        match r.bytes(from, to) {
            Answer::Slice(b) => (true, b.to_vec()),
            Answer::Gathered => (false, GATHERED.with_borrow(|g| g.clone())),
        }
    }

    /// A read's answer is the bytes asked for wherever the frames' edges fall: a slice of the
    /// frame that holds it whole, else gathered from the frames it spans (the buffer reused
    /// from one answer to the next holds only the newer answer).
    #[test]
    fn answers_are_sliced_from_one_frame_or_gathered_across_frames() {
        let file: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut r = Reader::default();
        for cut in [0, 1, 4096, 4097, 7000, 10_000].windows(2) {
            r.push(Bytes::copy_from_slice(&file[cut[0]..cut[1]]), 0);
        }
        assert_eq!((r.start, r.end), (0, 10_000));
        for (from, to, sliced) in [
            (0, 1, true),
            (1, 4096, true),
            (4097, 7000, true),
            (5000, 6000, true),
            (0, 10_000, false),
            (4000, 4200, false),
            (4096, 4097, true),
            (6999, 7001, false),
            (20, 30, true),
            (9_999, 10_000, true),
        ] {
            let (was_sliced, got) = answer(&r, from, to);
            assert_eq!(got, &file[from as usize..to as usize], "{from}..{to}");
            assert_eq!(was_sliced, sliced, "{from}..{to}");
        }
        assert_eq!(answer(&r, 500, 500).1, b"", "nothing asked, nothing answered");
    }

    /// Old frames leave the window once it holds more than `WINDOW`, but never those the read
    /// in hand still needs.
    #[test]
    fn the_window_keeps_what_the_read_in_hand_needs() {
        let frame = Bytes::from(vec![7u8; (WINDOW / 4) as usize]);
        let mut r = Reader::default();
        for _ in 0..6 {
            r.push(frame.clone(), 0);
        }
        assert_eq!((r.start, r.held()), (0, 6 * frame.len() as u64), "the read in hand starts at 0");
        r.push(frame.clone(), 5 * frame.len() as u64);
        assert_eq!(r.held(), WINDOW, "trimmed to the window once nothing older is needed");
        assert_eq!(r.end, 7 * frame.len() as u64);
    }
}
