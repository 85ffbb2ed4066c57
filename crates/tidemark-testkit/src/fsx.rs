//! A randomized exerciser of one file through a file system, in the spirit of xfstests' `fsx`
//! (its idea, not its code): random reads, writes, truncates up and down, mapped reads and
//! writes, `copy_file_range`, `fallocate` modes, `fsync` and close/reopen on one file, each
//! checked against a model of what the file must hold. After every operation the size is
//! checked twice (`fstat` and `lseek(SEEK_END)`); a read's bytes are compared as they come, and
//! the whole file every `verify_every` operations and at the end. A run is fixed by its seed: a
//! failure prints the seed and the operations before it, so it can be replayed.
//!
//! Run on a mount by `crates/tidemark/tests/fuse_mount.rs`, and by hand with
//! `cargo run -p tidemark-testkit --bin tidemark-fsx -- --help`.

use std::fmt;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

/// What to exercise, and how hard.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub ops: u64,
    pub seed: u64,
    /// Mapped reads and writes (`mmap`, `msync`).
    pub mmap: bool,
    /// `copy_file_range` within the file.
    pub copy_range: bool,
    /// `fallocate`, in every mode the file system takes (a mode refused with `EOPNOTSUPP` is
    /// not tried again, and is reported).
    pub fallocate: bool,
    /// Every mode must be taken: a refusal is a failure, not a note.
    pub require_all: bool,
    /// The file's largest size.
    pub max_len: u64,
    /// The longest read, write or copy.
    pub max_op: u64,
    /// Compare the whole file this often (in operations; 0: only at the end).
    pub verify_every: u64,
    /// Close and reopen the file about once in this many operations (0: never).
    pub reopen_every: u64,
    /// Start from the bytes the file holds (it must exist) rather than emptying it first.
    pub keep: bool,
    /// Reads and writes with `O_DIRECT` (fsx's `-Z`), in whole blocks of `DIRECT_BLOCK`, past
    /// the page cache; no mapped reads or writes then.
    pub direct: bool,
}

/// The alignment of `O_DIRECT` reads and writes: their offsets, lengths and buffers.
pub const DIRECT_BLOCK: u64 = 4096;

/// A buffer of `len` bytes at an address aligned for `O_DIRECT`.
struct Aligned {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let block = DIRECT_BLOCK as usize;
        let buf = vec![0u8; len + block];
        let at = (block - buf.as_ptr() as usize % block) % block;
        Aligned { buf, at, len }
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.buf[self.at..self.at + self.len]
    }
}

impl Config {
    pub fn new(path: impl Into<PathBuf>, seed: u64, ops: u64) -> Config {
        Config {
            path: path.into(),
            ops,
            seed,
            mmap: true,
            copy_range: true,
            fallocate: true,
            require_all: false,
            max_len: 256 << 10,
            max_op: 64 << 10,
            verify_every: 1000,
            reopen_every: 500,
            keep: false,
            direct: false,
        }
    }
}

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub ops: u64,
    /// Operations done, by kind.
    pub counts: std::collections::BTreeMap<&'static str, u64>,
    /// Operations the file system refused as unsupported (and were not tried again).
    pub unsupported: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} operations:", self.ops)?;
        for (k, n) in &self.counts {
            write!(f, " {k} {n}")?;
        }
        if !self.unsupported.is_empty() {
            write!(f, "; unsupported: {}", self.unsupported.join(", "))?;
        }
        Ok(())
    }
}

/// Why a run failed: the operation, what was wrong, and the operations before it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    /// The number of the operation that failed (from 1).
    pub op: u64,
    pub what: String,
    pub last: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "fsx: seed {}: operation {} failed: {}", self.seed, self.op, self.what)?;
        writeln!(f, "the last {} operations:", self.last.len())?;
        for l in &self.last {
            writeln!(f, "  {l}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

/// SplitMix64: the same sequence for a seed on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The `fallocate` modes tried, with what each does to the model.
const FALLOC_MODES: &[(&str, i32)] = &[
    ("falloc", 0),
    ("falloc-keep-size", libc::FALLOC_FL_KEEP_SIZE),
    ("punch-hole", libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE),
    ("zero-range", libc::FALLOC_FL_ZERO_RANGE),
    ("zero-range-keep-size", libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE),
];

/// One kind of operation the exerciser draws.
type Step<'a> = fn(&mut Run<'a>) -> Result<(), Failure>;

struct Run<'a> {
    cfg: &'a Config,
    rng: Rng,
    file: std::fs::File,
    model: Vec<u8>,
    log: std::collections::VecDeque<String>,
    n: u64,
    report: Report,
    page: u64,
    falloc_off: Vec<bool>,
    copy_off: bool,
}

const KEEP: usize = 30;

fn os_err() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn unsupported(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EXDEV))
}

impl Run<'_> {
    fn fail(&self, what: impl Into<String>) -> Failure {
        Failure { seed: self.cfg.seed, op: self.n, what: what.into(), last: self.log.iter().cloned().collect() }
    }

    fn note(&mut self, kind: &'static str, line: String) {
        if self.log.len() == KEEP {
            self.log.pop_front();
        }
        self.log.push_back(format!("{} {line}", self.n));
        *self.report.counts.entry(kind).or_default() += 1;
    }

    fn open(&self) -> std::io::Result<std::fs::File> {
        let direct = if self.cfg.direct { libc::O_DIRECT } else { 0 };
        std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC | direct).open(&self.cfg.path)
    }

    fn size(&self) -> u64 {
        self.model.len() as u64
    }

    /// The size as `fstat` and `lseek(SEEK_END)` see it, against the model's.
    fn check_size(&self) -> Result<(), Failure> {
        let want = self.size();
        let stat = self.file.metadata().map_err(|e| self.fail(format!("fstat: {e}")))?.len();
        let end = unsafe { libc::lseek(self.file.as_raw_fd(), 0, libc::SEEK_END) };
        if end < 0 {
            return Err(self.fail(format!("lseek(SEEK_END): {}", os_err())));
        }
        if stat != want || end as u64 != want {
            return Err(self.fail(format!("Size error: expected {want:#x} stat {stat:#x} seek end {end:#x}")));
        }
        Ok(())
    }

    /// `got`, read at `offset`, against the model.
    fn compare(&self, what: &str, offset: u64, got: &[u8]) -> Result<(), Failure> {
        let want = &self.model[offset as usize..offset as usize + got.len()];
        if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
            let at = offset + i as u64;
            let end = (i + 16).min(got.len());
            return Err(self.fail(format!(
                "{what}: bytes differ at {at:#x} (of {offset:#x}..{:#x}): expected {:02x?}, got {:02x?}",
                offset + got.len() as u64,
                &want[i..end],
                &got[i..end]
            )));
        }
        Ok(())
    }

    /// Up to `len` bytes at `offset` (fewer at the end of the file). With `O_DIRECT` the
    /// whole blocks around them are read into an aligned buffer.
    fn pread_all(&self, offset: u64, len: u64) -> Result<Vec<u8>, Failure> {
        let (start, end) = if self.cfg.direct {
            (offset / DIRECT_BLOCK * DIRECT_BLOCK, (offset + len).div_ceil(DIRECT_BLOCK) * DIRECT_BLOCK)
        } else {
            (offset, offset + len)
        };
        let mut aligned = Aligned::new((end - start) as usize);
        let buf = aligned.bytes();
        let mut n = 0;
        while n < buf.len() {
            match self.file.read_at(&mut buf[n..], start + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.fail(format!("read at {:#x}: {e}", start + n as u64))),
            }
        }
        let skew = (offset - start) as usize;
        let upto = n.min(skew + len as usize).max(skew);
        Ok(buf[skew..upto].to_vec())
    }

    fn verify_all(&self, why: &str) -> Result<(), Failure> {
        let got = self.pread_all(0, self.size() + 4096)?;
        if got.len() as u64 != self.size() {
            return Err(self.fail(format!(
                "{why}: the file reads as {:#x} bytes, expected {:#x}",
                got.len(),
                self.size()
            )));
        }
        self.compare(why, 0, &got)
    }

    /// An offset and length within the file (`None` if it is empty).
    fn within(&mut self) -> Option<(u64, u64)> {
        let size = self.size();
        if size == 0 {
            return None;
        }
        let off = self.rng.below(size);
        let len = 1 + self.rng.below(self.cfg.max_op.min(size - off));
        Some((off, len))
    }

    /// An offset and length anywhere below the largest size.
    fn anywhere(&mut self) -> (u64, u64) {
        let off = self.rng.below(self.cfg.max_len);
        let len = 1 + self.rng.below(self.cfg.max_op.min(self.cfg.max_len - off));
        (off, len)
    }

    fn resize(&mut self, len: u64) {
        self.model.resize(len as usize, 0);
    }

    fn read(&mut self) -> Result<(), Failure> {
        let Some((off, len)) = self.within() else {
            self.note("read", "READ of an empty file skipped".into());
            return Ok(());
        };
        self.note("read", format!("READ {off:#x} thru {:#x} ({len:#x} bytes)", off + len - 1));
        let got = self.pread_all(off, len)?;
        if got.len() as u64 != len {
            return Err(self.fail(format!("short read: {:#x} of {len:#x} bytes at {off:#x}", got.len())));
        }
        self.compare("read", off, &got)
    }

    fn write(&mut self) -> Result<(), Failure> {
        let (mut off, mut len) = self.anywhere();
        if self.cfg.direct {
            // Whole blocks, below the largest size.
            off = off / DIRECT_BLOCK * DIRECT_BLOCK;
            len = len.div_ceil(DIRECT_BLOCK) * DIRECT_BLOCK;
            off = off.min(self.cfg.max_len.saturating_sub(len) / DIRECT_BLOCK * DIRECT_BLOCK);
        }
        let mut aligned = Aligned::new(len as usize);
        for b in aligned.bytes() {
            *b = self.rng.next() as u8;
        }
        let data = aligned.bytes().to_vec();
        let how = if off > self.size() {
            "HOLE"
        } else if off + len > self.size() {
            "EXTEND"
        } else {
            "interior"
        };
        self.note("write", format!("WRITE {off:#x} thru {:#x} ({len:#x} bytes) {how}", off + len - 1));
        self.file.write_all_at(aligned.bytes(), off).map_err(|e| self.fail(format!("write at {off:#x}: {e}")))?;
        if off + len > self.size() {
            self.resize(off + len);
        }
        self.model[off as usize..(off + len) as usize].copy_from_slice(&data);
        Ok(())
    }

    fn truncate(&mut self) -> Result<(), Failure> {
        let to = self.rng.below(self.cfg.max_len + 1);
        let dir = if to < self.size() { "DOWN" } else { "UP" };
        self.note("truncate", format!("TRUNCATE {dir} from {:#x} to {to:#x}", self.size()));
        self.file.set_len(to).map_err(|e| self.fail(format!("ftruncate to {to:#x}: {e}")))?;
        self.resize(to);
        Ok(())
    }

    /// A shared map of `len` bytes at `off` (its start rounded down to a page).
    fn map(&self, off: u64, len: u64, write: bool) -> Result<(*mut u8, usize, usize), Failure> {
        let start = off & !(self.page - 1);
        let skew = (off - start) as usize;
        let mlen = skew + len as usize;
        let prot = if write { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), mlen, prot, libc::MAP_SHARED, self.file.as_raw_fd(), start as libc::off_t)
        };
        if p == libc::MAP_FAILED {
            return Err(self.fail(format!("mmap {start:#x}+{mlen:#x}: {}", os_err())));
        }
        Ok((p as *mut u8, mlen, skew))
    }

    fn map_read(&mut self) -> Result<(), Failure> {
        let Some((off, len)) = self.within() else { return Ok(()) };
        self.note("mapread", format!("MAPREAD {off:#x} thru {:#x} ({len:#x} bytes)", off + len - 1));
        let (p, mlen, skew) = self.map(off, len, false)?;
        // Within the file's size: no page of the map lies wholly past its end (SIGBUS).
        let got = unsafe { std::slice::from_raw_parts(p.add(skew), len as usize) }.to_vec();
        unsafe { libc::munmap(p as *mut libc::c_void, mlen) };
        self.compare("mapped read", off, &got)
    }

    fn map_write(&mut self) -> Result<(), Failure> {
        let (off, len) = self.anywhere();
        let data: Vec<u8> = (0..len).map(|_| self.rng.next() as u8).collect();
        let grow = off + len > self.size();
        self.note(
            "mapwrite",
            format!(
                "MAPWRITE {off:#x} thru {:#x} ({len:#x} bytes){}",
                off + len - 1,
                if grow { " EXTEND" } else { "" }
            ),
        );
        // A map does not grow a file: it is truncated up first, as fsx does.
        if grow {
            self.file.set_len(off + len).map_err(|e| self.fail(format!("ftruncate before a mapped write: {e}")))?;
            self.resize(off + len);
        }
        let (p, mlen, skew) = self.map(off, len, true)?;
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(skew), len as usize);
            let r = libc::msync(p as *mut libc::c_void, mlen, libc::MS_SYNC);
            let e = os_err();
            libc::munmap(p as *mut libc::c_void, mlen);
            if r != 0 {
                return Err(self.fail(format!("msync: {e}")));
            }
        }
        self.model[off as usize..(off + len) as usize].copy_from_slice(&data);
        Ok(())
    }

    fn copy(&mut self) -> Result<(), Failure> {
        let Some((mut src, mut len)) = self.within() else { return Ok(()) };
        if self.cfg.direct {
            // Whole blocks within the file: a direct copy's ranges are aligned as its I/O is.
            src = src / DIRECT_BLOCK * DIRECT_BLOCK;
            len = len / DIRECT_BLOCK * DIRECT_BLOCK;
            if len == 0 || src + len > self.size() {
                return Ok(());
            }
        }
        // Linux refuses a copy within one file whose ranges overlap.
        let mut dst = None;
        for _ in 0..8 {
            let mut d = self.rng.below(self.cfg.max_len - len + 1);
            if self.cfg.direct {
                d = d / DIRECT_BLOCK * DIRECT_BLOCK;
            }
            if d + len <= src || src + len <= d {
                dst = Some(d);
                break;
            }
        }
        let Some(dst) = dst else { return Ok(()) };
        self.note(
            "copy",
            format!("COPY {src:#x} thru {:#x} to {dst:#x} thru {:#x} ({len:#x} bytes)", src + len - 1, dst + len - 1),
        );
        let fd = self.file.as_raw_fd();
        let (mut from, mut to, mut left) = (src as libc::loff_t, dst as libc::loff_t, len as usize);
        while left > 0 {
            let n = unsafe { libc::copy_file_range(fd, &mut from, fd, &mut to, left, 0) };
            if n < 0 {
                let e = os_err();
                if unsupported(&e) && left == len as usize && !self.cfg.require_all {
                    self.copy_off = true;
                    self.report.unsupported.push(format!("copy_file_range ({e})"));
                    return Ok(());
                }
                return Err(self.fail(format!("copy_file_range: {e}")));
            }
            if n == 0 {
                return Err(self.fail(format!("copy_file_range copied nothing with {left:#x} bytes left")));
            }
            left -= n as usize;
        }
        if dst + len > self.size() {
            self.resize(dst + len);
        }
        self.model.copy_within(src as usize..(src + len) as usize, dst as usize);
        Ok(())
    }

    fn fallocate(&mut self) -> Result<(), Failure> {
        let open: Vec<usize> = (0..FALLOC_MODES.len()).filter(|i| !self.falloc_off[*i]).collect();
        if open.is_empty() {
            return Ok(());
        }
        let i = open[self.rng.below(open.len() as u64) as usize];
        let (name, mode) = FALLOC_MODES[i];
        let (off, len) = self.anywhere();
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let size = self.size();
        let how = if off >= size {
            "PAST_EOF"
        } else if off + len > size {
            "EXTENDING"
        } else {
            "INTERIOR"
        };
        self.note("fallocate", format!("FALLOC {name} {off:#x} thru {:#x} ({len:#x} bytes) {how}", off + len - 1));
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t) };
        if r != 0 {
            let e = os_err();
            if unsupported(&e) && !self.cfg.require_all {
                self.falloc_off[i] = true;
                self.report.unsupported.push(format!("fallocate {name} ({e})"));
                return Ok(());
            }
            return Err(self.fail(format!("fallocate {name} {off:#x}+{len:#x}: {e}")));
        }
        let end = off + len;
        if !keep && end > size {
            self.resize(end);
        }
        if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
            let to = end.min(self.size());
            if off < to {
                self.model[off as usize..to as usize].fill(0);
            }
        }
        Ok(())
    }

    fn fsync(&mut self) -> Result<(), Failure> {
        self.note("fsync", "FSYNC".into());
        self.file.sync_all().map_err(|e| self.fail(format!("fsync: {e}")))
    }

    fn reopen(&mut self) -> Result<(), Failure> {
        self.note("reopen", "CLOSE/OPEN".into());
        let fresh = self.open().map_err(|e| self.fail(format!("reopen: {e}")))?;
        // The old descriptor closes here, after the new one opened (as fsx -c does it).
        self.file = fresh;
        self.verify_all("after reopening")
    }

    fn step(&mut self) -> Result<(), Failure> {
        let mut kinds: Vec<Step<'_>> = vec![Self::read, Self::read, Self::write, Self::write, Self::truncate];
        if self.cfg.mmap && !self.cfg.direct {
            kinds.extend([Self::map_read as Step<'_>, Self::map_write]);
        }
        if self.cfg.copy_range && !self.copy_off {
            kinds.push(Self::copy);
        }
        if self.cfg.fallocate {
            kinds.push(Self::fallocate);
        }
        kinds.push(Self::fsync);
        if self.cfg.reopen_every > 0 && self.rng.below(self.cfg.reopen_every) == 0 {
            return self.reopen();
        }
        let k = kinds[self.rng.below(kinds.len() as u64) as usize];
        k(self)
    }
}

/// Exercises the file at `cfg.path` (created or emptied first, unless `cfg.keep`).
pub fn run(cfg: &Config) -> Result<Report, Failure> {
    let fail0 = |what: String| Failure { seed: cfg.seed, op: 0, what, last: Vec::new() };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(!cfg.keep)
        .truncate(!cfg.keep)
        .custom_flags(if cfg.direct { libc::O_DIRECT } else { 0 })
        .open(&cfg.path)
        .map_err(|e| fail0(format!("open {}: {e}", cfg.path.display())))?;
    let model = if cfg.keep {
        std::fs::read(&cfg.path).map_err(|e| fail0(format!("read {}: {e}", cfg.path.display())))?
    } else {
        Vec::new()
    };
    let mut run = Run {
        cfg,
        rng: Rng(cfg.seed ^ 0x5EED_F5C5),
        file,
        model,
        log: Default::default(),
        n: 0,
        report: Report::default(),
        page: (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64,
        falloc_off: vec![false; FALLOC_MODES.len()],
        copy_off: false,
    };
    for n in 1..=cfg.ops {
        run.n = n;
        run.step()?;
        run.check_size()?;
        if cfg.verify_every > 0 && n % cfg.verify_every == 0 {
            run.verify_all("whole-file check")?;
        }
    }
    run.n = cfg.ops + 1;
    run.note("final", "FINAL CHECK".into());
    run.verify_all("at the end")?;
    run.file.sync_all().map_err(|e| run.fail(format!("final fsync: {e}")))?;
    run.reopen()?;
    run.report.ops = cfg.ops;
    Ok(run.report)
}
