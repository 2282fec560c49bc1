//! The memory-mapped, append-only vector file.
//!
//! Layout (little endian):
//! ```text
//! 0..8    magic "CLAGVEC\0"
//! 8..12   format version (u32)
//! 12..16  dim (u32)
//! 16..40  commit slot 0: seq (u64), count (u64), checksum (u64)
//! 40..64  commit slot 1: same
//! 64..    rows, dim f32 each, L2-normalised; the file is grown in chunks, so bytes past
//!         the committed count are spare capacity (or the torn tail of a crashed append)
//! ```
//! Crash safety: an append writes the row bytes first, then the *other* commit slot with
//! seq + 1 and the new count. A slot counts only if its checksum (over magic, version, dim,
//! seq, count) matches, and the valid slot with the higher seq wins. A process killed at any
//! point therefore leaves either the old or the new count, never a torn one, and rows past
//! the count are never read (they are overwritten by the next append). The page cache
//! survives the death of the process, so every append that returned is kept.
//! Against power loss, `sync()` msyncs the new rows *before* the header: after it returns
//! everything appended so far is on disk; appends after the last sync may be lost.
//!
//! Growth remaps the file. Old mappings are reference counted (`Arc`) so numpy views
//! handed out earlier stay valid until they are dropped.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};

use crate::bytes::{fnv1a, Reader, Writer};
use crate::error::{Error, Result};
use crate::kernels;

pub const MAGIC: [u8; 8] = *b"CLAGVEC\0";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 64;
const SLOT0: usize = 16;
const SLOT_LEN: usize = 24;
/// Largest dimension accepted (guards against absurd headers and allocation blow-ups).
pub const MAX_DIM: usize = 1 << 16;
/// Smallest growth step; bigger files grow by half their size, so remaps are rare.
const MIN_GROW_BYTES: usize = 4 << 20;
/// Bytes of rows normalised and written per pwrite in `append`.
const APPEND_CHUNK_BYTES: usize = 1 << 20;

/// The checksum of a commit slot, over magic, version, dim, seq and count: FNV-1a, as format
/// version 1 fixes it (slots are rewritten in place by every append, so a file keeps the
/// version it was created with).
fn slot_checksum(dim: u32, seq: u64, count: u64) -> u64 {
    let mut w = Writer::with_capacity(32);
    w.put_bytes(&MAGIC);
    w.put(VERSION);
    w.put(dim);
    w.put(seq);
    w.put(count);
    fnv1a(&w.into_bytes())
}

fn header_bytes(dim: u32, count: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    let mut w = Writer::with_capacity(SLOT0);
    w.put_bytes(&MAGIC);
    w.put(VERSION);
    w.put(dim);
    h[..SLOT0].copy_from_slice(&w.into_bytes());
    write_slot(&mut h[SLOT0..SLOT0 + SLOT_LEN], dim, 1, count);
    h
}

fn write_slot(dst: &mut [u8], dim: u32, seq: u64, count: u64) {
    let mut w = Writer::with_capacity(SLOT_LEN);
    w.put(seq);
    w.put(count);
    w.put(slot_checksum(dim, seq, count));
    dst.copy_from_slice(&w.into_bytes());
}

/// Parsed header: (dim, active slot index, seq, count). Every failure is an `Error::Io`
/// naming the file and the problem; nothing is modified.
pub fn parse_header(h: &[u8], path: &Path) -> Result<(usize, usize, u64, u64)> {
    let p = path.display();
    if h.len() < HEADER_LEN {
        return Err(Error::Io(format!("{p}: truncated header ({} bytes, need {HEADER_LEN})", h.len())));
    }
    if h[0..8] != MAGIC {
        return Err(Error::Io(format!("{p}: not a clag_fast vector file (bad magic)")));
    }
    let mut r = Reader::new(&h[..HEADER_LEN], "header");
    r.take(8)?;
    let version = r.get::<u32>()?;
    if version != VERSION {
        return Err(Error::Io(format!(
            "{p}: vector file format version {version} is not supported (this build reads version {VERSION})"
        )));
    }
    let dim = r.get::<u32>()?;
    if dim == 0 || dim as usize > MAX_DIM {
        return Err(Error::Io(format!("{p}: corrupt header (dim {dim})")));
    }
    let mut best: Option<(usize, u64, u64)> = None;
    for s in 0..2 {
        let (seq, count, sum) = (r.get::<u64>()?, r.get::<u64>()?, r.get::<u64>()?);
        if sum == slot_checksum(dim, seq, count) && best.is_none_or(|b| seq > b.1) {
            best = Some((s, seq, count));
        }
    }
    let (slot, seq, count) =
        best.ok_or_else(|| Error::Io(format!("{p}: corrupt header (no commit slot has a valid checksum)")))?;
    Ok((dim as usize, slot, seq, count))
}

/// A mapping kept alive by every view into it.
pub type Map = Arc<MmapRaw>;

pub struct VectorFile {
    path: PathBuf,
    file: File,
    map: Map,
    dim: usize,
    count: usize,
    /// Rows the mapping (file length) has room for.
    capacity: usize,
    seq: u64,
    slot: usize,
    synced: usize,
    writable: bool,
}

impl VectorFile {
    /// Open `path`, creating it (with `dim`, which is then required) when it does not exist
    /// and `writable` is set. An existing file's dim must equal `dim` when one is given.
    pub fn open(path: &Path, dim: Option<usize>, writable: bool) -> Result<Self> {
        if let Some(d) = dim {
            if d == 0 || d > MAX_DIM {
                return Err(Error::Value(format!("dim must be in 1..={MAX_DIM}, got {d}")));
            }
        }
        if !path.exists() {
            if !writable {
                return Err(Error::Io(format!("{}: no such vector file", path.display())));
            }
            let d = dim.ok_or_else(|| Error::Value(format!("{}: dim is required to create a new index", path.display())))?;
            create(path, d)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        if writable {
            // One writer at a time; readers take no lock and read the committed count.
            // SAFETY: plain syscall on a valid descriptor.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc != 0 {
                return Err(Error::Io(format!("{}: already open for writing by another process", path.display())));
            }
        }
        let len = file.metadata()?.len() as usize;
        let mut head = [0u8; HEADER_LEN];
        let n = read_up_to(&mut &file, &mut head)?;
        let (fdim, slot, seq, count) = parse_header(&head[..n], path)?;
        if let Some(d) = dim {
            if d != fdim {
                return Err(Error::Value(format!("{}: index has dim {fdim}, but dim={d} was requested", path.display())));
            }
        }
        let row_bytes = fdim * 4;
        let count = count as usize;
        let need = HEADER_LEN as u128 + count as u128 * row_bytes as u128;
        if need > len as u128 {
            return Err(Error::Io(format!(
                "{}: truncated or corrupt file: header commits {count} rows ({need} bytes) but the file has {len} bytes",
                path.display()
            )));
        }
        let capacity = (len - HEADER_LEN) / row_bytes;
        let map = map_file(&file, len, writable)?;
        Ok(VectorFile {
            path: path.to_path_buf(),
            file,
            map: Arc::new(map),
            dim: fdim,
            count,
            capacity,
            seq,
            slot,
            synced: count,
            writable,
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// All committed rows as one slice (count x dim).
    pub fn rows(&self) -> &[f32] {
        if self.count == 0 {
            return &[];
        }
        // SAFETY: the mapping covers HEADER_LEN + capacity * dim * 4 >= the committed rows,
        // the offset 64 keeps f32 alignment (mmap is page aligned), and committed rows are
        // never written again.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(HEADER_LEN) as *const f32, self.count * self.dim) }
    }

    /// One row.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.rows()[r * self.dim..(r + 1) * self.dim]
    }

    /// The current mapping (kept alive by views) and the byte offset of row 0.
    pub fn map(&self) -> Map {
        Arc::clone(&self.map)
    }

    /// Append rows (n x dim, any non-zero finite values); they are stored L2-normalised.
    /// Validation runs over the whole batch first, so on error nothing is written.
    /// Returns the first new row id.
    pub fn append(&mut self, data: &[f32]) -> Result<usize> {
        if !self.writable {
            return Err(Error::Io(format!("{}: opened read-only", self.path.display())));
        }
        let inv = kernels::check_rows(data, self.dim, "append")?;
        let n = inv.len();
        let first = self.count;
        if n == 0 {
            return Ok(first);
        }
        if first as u64 + n as u64 > u32::MAX as u64 {
            return Err(Error::Value("the index is limited to 2^32 - 1 rows".into()));
        }
        self.reserve(first + n)?;
        let dim = self.dim;
        // The rows go in with pwrite, not through the mapping: a store into a mapped page
        // past the file's written data faults and allocates that page on the spot (100k rows
        // of 384 through `VectorIndex.append`: 226-278 ms through the mapping, 133-186 ms with
        // pwrite). The mapping shares the page cache, so it sees the rows once the call
        // returns, and `sync` (msync of the range) writes them out on Linux and macOS. Normalised in chunks
        // of APPEND_CHUNK_BYTES, so the buffer stays small and in cache.
        let rb = dim * 4;
        let per = (APPEND_CHUNK_BYTES / rb).max(1);
        let mut buf: Vec<f32> = Vec::with_capacity(per.min(n) * dim);
        for (c, (rows, scales)) in data.chunks(per * dim).zip(inv.chunks(per)).enumerate() {
            buf.clear();
            for (s, &f) in rows.chunks_exact(dim).zip(scales) {
                buf.extend(s.iter().map(|x| x * f));
            }
            // SAFETY: plain f32s viewed as their bytes (the file is little endian, as are
            // the targets this crate builds for; the mapping reads them back the same way).
            let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 4) };
            let off = HEADER_LEN + (first + c * per) * rb;
            self.file
                .write_all_at(bytes, off as u64)
                .map_err(|e| Error::Io(format!("{}: cannot write rows: {e}", self.path.display())))?;
        }
        start_writeback(&self.file, HEADER_LEN + first * rb, n * rb);
        // Rows must be in memory before the count that makes them visible.
        fence(Ordering::Release);
        self.commit(first + n);
        Ok(first)
    }

    fn commit(&mut self, count: usize) {
        let slot = 1 - self.slot;
        let seq = self.seq + 1;
        let mut buf = [0u8; SLOT_LEN];
        write_slot(&mut buf, self.dim as u32, seq, count as u64);
        // SAFETY: the header lies inside the mapping; only this (locked) writer writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), self.map.as_mut_ptr().add(SLOT0 + slot * SLOT_LEN), SLOT_LEN);
        }
        fence(Ordering::Release);
        self.slot = slot;
        self.seq = seq;
        self.count = count;
    }

    /// Make room for `rows` rows: grow the file by at least half its size (or 4 MiB) and remap.
    fn reserve(&mut self, rows: usize) -> Result<()> {
        if rows <= self.capacity {
            return Ok(());
        }
        let row_bytes = self.dim * 4;
        let grow = (self.capacity * row_bytes / 2).max(MIN_GROW_BYTES) / row_bytes;
        let cap = rows.max(self.capacity + grow.max(1));
        let len = HEADER_LEN + cap * row_bytes;
        self.file
            .set_len(len as u64)
            .map_err(|e| Error::Io(format!("{}: cannot grow the file: {e}", self.path.display())))?;
        self.map = Arc::new(map_file(&self.file, len, true)?);
        self.capacity = cap;
        Ok(())
    }

    /// Durably write the rows appended since the last sync, then the header.
    pub fn sync(&mut self) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        let rb = self.dim * 4;
        if self.count > self.synced {
            let off = HEADER_LEN + self.synced * rb;
            self.map.flush_range(off, (self.count - self.synced) * rb)?;
        }
        self.map.flush_range(0, HEADER_LEN)?;
        self.synced = self.count;
        Ok(())
    }

    /// Sync and trim spare capacity so the closed file is exactly header + rows.
    pub fn close(mut self) -> Result<()> {
        if self.writable {
            self.sync()?;
            let len = HEADER_LEN + self.count * self.dim * 4;
            // Views may still hold the old mapping; truncating the file under them would
            // make touching the cut pages fault, so only trim when no view is alive.
            if Arc::strong_count(&self.map) == 1 {
                self.file.set_len(len as u64)?;
                self.file.sync_all()?;
            }
        }
        Ok(())
    }
}

fn read_up_to(f: &mut &File, buf: &mut [u8]) -> Result<usize> {
    use std::io::Read;
    let mut n = 0;
    while n < buf.len() {
        let r = f.read(&mut buf[n..])?;
        if r == 0 {
            break;
        }
        n += r;
    }
    Ok(n)
}

fn map_file(file: &File, len: usize, writable: bool) -> Result<MmapRaw> {
    let opts = {
        let mut o = MmapOptions::new();
        o.len(len);
        o
    };
    let m = if writable { opts.map_raw(file) } else { opts.map_raw_read_only(file) };
    m.map_err(|e| Error::Io(format!("mmap failed: {e}")))
}

/// Create an empty vector file atomically: write a temp file, fsync, rename, fsync the dir.
fn create(path: &Path, dim: usize) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
        std::process::id()
    ));
    {
        let mut f = File::create(&tmp).map_err(|e| Error::Io(format!("{}: {e}", tmp.display())))?;
        f.write_all(&header_bytes(dim as u32, 0))?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Ask the kernel to start writing a just-appended byte range to disk, without waiting: the
/// next `sync` (an organisation's, a flush's) then finds the pages clean or in flight instead
/// of writing tens of MB while the caller waits (at 300k-400k memories the syncs of
/// organisation waited ~0.8 s of I/O per 100k adds). Linux only; a no-op elsewhere, and a
/// failure is ignored (the sync still writes whatever is left).
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, off: usize, len: usize) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor; no memory is passed.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), off as libc::off64_t, len as libc::off64_t, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _off: usize, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn create_append_reopen() {
        let d = tmp();
        let p = d.path().join("v.f32");
        let mut v = VectorFile::open(&p, Some(3), true).unwrap();
        assert_eq!(v.append(&[3.0, 4.0, 0.0, 0.0, 0.0, 2.0]).unwrap(), 0);
        assert_eq!(v.len(), 2);
        assert_eq!(v.row(0), &[0.6, 0.8, 0.0]);
        v.close().unwrap();
        let v = VectorFile::open(&p, None, false).unwrap();
        assert_eq!((v.len(), v.dim()), (2, 3));
        assert_eq!(v.row(1), &[0.0, 0.0, 1.0]);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), (HEADER_LEN + 2 * 12) as u64);
    }

    #[test]
    fn bad_rows_write_nothing() {
        let d = tmp();
        let p = d.path().join("v.f32");
        let mut v = VectorFile::open(&p, Some(2), true).unwrap();
        assert!(matches!(v.append(&[1.0, 0.0, f32::INFINITY, 1.0]), Err(Error::Value(_))));
        assert!(matches!(v.append(&[1.0, 0.0, 0.0, 0.0]), Err(Error::Value(_))));
        assert!(matches!(v.append(&[1.0, 0.0, 0.0]), Err(Error::Value(_))));
        assert_eq!(v.len(), 0);
    }

    #[test]
    fn grows_past_initial_capacity() {
        let d = tmp();
        let p = d.path().join("v.f32");
        let mut v = VectorFile::open(&p, Some(512), true).unwrap();
        let row: Vec<f32> = (0..512).map(|i| i as f32 + 1.0).collect();
        let view = v.map();
        for _ in 0..5000 {
            v.append(&row).unwrap();
        }
        assert_eq!(v.len(), 5000);
        assert!(Arc::strong_count(&view) == 1); // the old mapping is still alive for its holder
        let n = norm_f64(v.row(4999));
        assert!((n - 1.0).abs() < 1e-6);
    }

    fn norm_f64(r: &[f32]) -> f64 {
        kernels::norm_f64(r)
    }

    #[test]
    fn torn_slot_falls_back_to_previous_count() {
        let d = tmp();
        let p = d.path().join("v.f32");
        let mut v = VectorFile::open(&p, Some(2), true).unwrap();
        v.append(&[1.0, 0.0]).unwrap();
        v.append(&[0.0, 1.0]).unwrap();
        let active = v.slot;
        v.sync().unwrap();
        drop(v);
        // Corrupt the newest slot's checksum, as if the process died while writing it.
        let mut b = std::fs::read(&p).unwrap();
        b[SLOT0 + active * SLOT_LEN + 16] ^= 0xff;
        std::fs::write(&p, &b).unwrap();
        let v = VectorFile::open(&p, None, true).unwrap();
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn foreign_and_corrupt_files_are_rejected_untouched() {
        let d = tmp();
        for (name, bytes) in [
            ("short", b"CLAG".to_vec()),
            ("foreign", vec![7u8; 200]),
            ("version", {
                let mut h = header_bytes(4, 0).to_vec();
                h[8] = 9;
                h
            }),
            ("badsum", {
                let mut h = header_bytes(4, 0).to_vec();
                h[SLOT0 + 8] = 1;
                h
            }),
            ("truncated", header_bytes(4, 10).to_vec()),
        ] {
            let p = d.path().join(name);
            std::fs::write(&p, &bytes).unwrap();
            let e = VectorFile::open(&p, None, true).err().expect(name);
            assert!(matches!(e, Error::Io(_)), "{name}: {e}");
            assert_eq!(std::fs::read(&p).unwrap(), bytes, "{name} modified");
        }
        let p = d.path().join("ok");
        VectorFile::open(&p, Some(4), true).unwrap().close().unwrap();
        assert!(matches!(VectorFile::open(&p, Some(5), true), Err(Error::Value(_))));
    }

    #[test]
    fn second_writer_is_refused() {
        let d = tmp();
        let p = d.path().join("v.f32");
        let _a = VectorFile::open(&p, Some(2), true).unwrap();
        assert!(matches!(VectorFile::open(&p, Some(2), true), Err(Error::Io(_))));
        assert!(VectorFile::open(&p, Some(2), false).is_ok());
    }
}
