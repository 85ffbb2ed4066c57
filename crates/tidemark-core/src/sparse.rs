//! A sparse body: a write that sends only the ranges of a file that hold data, and names them,
//! so that a file written far past its end (a database's preallocated file, pjdfstest's 2 GiB
//! file of one byte) does not send its holes' zeros over the wire. The filer reads the zeros
//! back into the stream itself ([`expand`]): its MD5 is of the whole file, and its blob is left
//! sparse as any run of zeros is.

use bytes::Bytes;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::filer::ByteStream;

/// The most data ranges one sparse body names: a file more fragmented than this is sent whole
/// (the layout travels in one request header).
pub const MAX_RANGES: usize = 256;

/// The file's size, and the ranges of it (`offset`, `len`; in order, apart, within the size,
/// none empty) that the body holds one after the other; everything else reads as zeros.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sparse {
    pub size: u64,
    pub data: Vec<(u64, u64)>,
}

impl Sparse {
    /// A layout, checked: ranges in order and apart, none empty, none past `size`, at most
    /// [`MAX_RANGES`].
    pub fn new(size: u64, data: Vec<(u64, u64)>) -> Result<Sparse> {
        if data.len() > MAX_RANGES {
            return Err(Error::invalid_argument(format!(
                "a sparse body names {} data ranges; at most {MAX_RANGES}: send the file whole",
                data.len()
            )));
        }
        let mut end = 0u64;
        for &(off, len) in &data {
            let stop = off.checked_add(len).filter(|s| *s <= size);
            match stop {
                Some(stop) if len > 0 && off >= end => end = stop,
                _ => {
                    return Err(Error::invalid_argument(format!(
                        "a sparse body's range {off}+{len} is empty, out of order, overlapping or past its size {size}"
                    )));
                }
            }
        }
        Ok(Sparse { size, data })
    }

    /// The bytes the body holds.
    pub fn data_len(&self) -> u64 {
        self.data.iter().map(|(_, len)| len).sum()
    }

    /// As a header's value: `SIZE` then `;OFFSET+LEN` for each range.
    pub fn to_header(&self) -> String {
        let mut s = self.size.to_string();
        for (off, len) in &self.data {
            s.push_str(&format!(";{off}+{len}"));
        }
        s
    }

    /// The inverse of [`to_header`](Self::to_header), refusing what is not a layout.
    pub fn parse(v: &str) -> Result<Sparse> {
        let bad = || Error::invalid_argument(format!("malformed sparse layout {v:?}: want SIZE;OFFSET+LEN;…"));
        let mut parts = v.split(';');
        let size = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        let mut data = Vec::new();
        for p in parts {
            if data.len() == MAX_RANGES {
                return Err(Error::invalid_argument(format!("a sparse body names more than {MAX_RANGES} data ranges")));
            }
            let (off, len) = p.split_once('+').ok_or_else(bad)?;
            data.push((off.parse().map_err(|_| bad())?, len.parse().map_err(|_| bad())?));
        }
        Sparse::new(size, data)
    }
}

/// Zeros to yield for a hole, shared: a hole costs no allocation.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

struct Expanding {
    body: ByteStream,
    /// What the body sent that belongs to the next ranges.
    held: Bytes,
    layout: Sparse,
    next: usize,
    pos: u64,
    failed: bool,
}

/// The whole file a sparse body stands for: the body's bytes at their ranges, zeros between
/// them and up to the size. A body shorter or longer than its ranges ends the stream with an
/// error (nothing of it is stored).
pub fn expand(body: ByteStream, layout: Sparse) -> ByteStream {
    let start = Expanding { body, held: Bytes::new(), layout, next: 0, pos: 0, failed: false };
    futures::stream::unfold(start, |mut s| async move {
        if s.failed {
            return None;
        }
        let fail = |mut s: Expanding, msg: String| {
            s.failed = true;
            Some((Err(std::io::Error::new(std::io::ErrorKind::InvalidData, msg)), s))
        };
        let (hole_end, range_end) = match s.layout.data.get(s.next) {
            Some(&(off, len)) => (off, off + len),
            None => (s.layout.size, s.layout.size),
        };
        if s.pos < hole_end {
            let n = (hole_end - s.pos).min(ZEROS.len() as u64);
            s.pos += n;
            return Some((Ok(Bytes::from_static(&ZEROS[..n as usize])), s));
        }
        if s.pos < range_end {
            if s.held.is_empty() {
                match s.body.next().await {
                    Some(Ok(b)) => s.held = b,
                    Some(Err(e)) => {
                        s.failed = true;
                        return Some((Err(e), s));
                    }
                    None => {
                        let msg = format!("the sparse body ended at byte {} of its range ending at {range_end}", s.pos);
                        return fail(s, msg);
                    }
                }
            }
            let n = (range_end - s.pos).min(s.held.len() as u64) as usize;
            let part = s.held.split_to(n);
            s.pos += n as u64;
            if s.pos == range_end {
                s.next += 1;
            }
            return Some((Ok(part), s));
        }
        // The size reached: the body must be used up.
        if !s.held.is_empty() {
            return fail(s, "the sparse body holds more bytes than its ranges".into());
        }
        loop {
            match s.body.next().await {
                Some(Ok(b)) if b.is_empty() => continue,
                Some(Ok(_)) => return fail(s, "the sparse body holds more bytes than its ranges".into()),
                Some(Err(e)) => {
                    s.failed = true;
                    return Some((Err(e), s));
                }
                None => return None,
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: &[&'static [u8]]) -> ByteStream {
        futures::stream::iter(parts.iter().map(|p| Ok(Bytes::from_static(p))).collect::<Vec<_>>()).boxed()
    }

    async fn whole(s: ByteStream) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut s = s;
        while let Some(b) = s.next().await {
            out.extend_from_slice(&b?);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn a_sparse_body_reads_back_as_its_whole_file() {
        let layout = Sparse::new(12, vec![(2, 3), (8, 2)]).unwrap();
        let got = whole(expand(body(&[b"ab", b"cde"]), layout.clone())).await.unwrap();
        assert_eq!(got, b"\0\0abc\0\0\0de\0\0");
        assert_eq!(Sparse::parse(&layout.to_header()).unwrap(), layout);
        // All hole, larger than the zeros shared.
        let big = Sparse::new(3 << 20, vec![]).unwrap();
        let got = whole(expand(body(&[]), big)).await.unwrap();
        assert!(got.len() == 3 << 20 && got.iter().all(|b| *b == 0));
    }

    #[tokio::test]
    async fn a_body_that_disagrees_with_its_layout_is_refused() {
        let layout = Sparse::new(10, vec![(0, 4)]).unwrap();
        assert!(whole(expand(body(&[b"abc"]), layout.clone())).await.is_err(), "short");
        assert!(whole(expand(body(&[b"abcde"]), layout.clone())).await.is_err(), "long");
        assert!(whole(expand(body(&[b"abcd", b"e"]), layout)).await.is_err(), "long, later");
        for bad in ["", "x", "10;4", "10;5+0", "10;5+6", "10;4+2;5+1", "10;-1+2"] {
            assert!(Sparse::parse(bad).is_err(), "{bad:?} refused");
        }
        let many = (0..=MAX_RANGES as u64).map(|i| (i * 2, 1)).collect();
        assert!(Sparse::new(1 << 20, many).is_err(), "too many ranges");
    }
}
