//! The byte layer under every file the crate writes (`vectors.f32`'s header, `clusters.bin`,
//! `lexical.bin`): little-endian numbers written by `Writer`, read back by the bounds-checked
//! `Reader`, and one checksum (`checksum`) over each file.
//!
//! A checksummed file is framed the same way in every format (`Format`):
//! ```text
//! magic (8 bytes) | version u32 | body ... | checksum u64 of every byte before it
//! ```
//! Files of older versions name the checksum they were written with in their format's table,
//! so they keep loading after the checksum changed.

use crate::error::{Error, Result};

/// A number stored as its little-endian bytes.
///
/// # Safety
/// Implemented only for plain numbers without padding whose every bit pattern is a valid
/// value: slices of them are copied to and from bytes wholesale on little-endian targets.
pub unsafe trait Le: Copy {
    const SIZE: usize;
    fn put(self, b: &mut Vec<u8>);
    /// Decode from exactly `SIZE` bytes.
    fn get(b: &[u8]) -> Self;
}

macro_rules! le {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive number: no padding, every bit pattern valid.
        unsafe impl Le for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline]
            fn put(self, b: &mut Vec<u8>) {
                b.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn get(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().unwrap())
            }
        }
    )*};
}
le!(u8, u16, u32, u64, i64, f32, f64);

/// The checksum of every file the crate writes: four interleaved 64-bit multiply-rotate lanes
/// over 8-byte words, several GB/s (FNV-1a, a byte at a time, would spend ~0.15 s on a
/// 1M-memory lexical index). It detects torn and flipped bytes; it is not a defence against
/// a crafted file.
pub fn checksum(b: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut lanes = [0x243F_6A88_85A3_08D3u64, 0x1319_8A2E_0370_7344, 0xA409_3822_299F_31D0, 0x082E_FA98_EC4E_6C89];
    let mut blocks = b.chunks_exact(32);
    for blk in &mut blocks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(blk[i * 8..i * 8 + 8].try_into().unwrap());
            *lane = (*lane ^ w).wrapping_mul(K).rotate_left(29);
        }
    }
    let mut h = (b.len() as u64).wrapping_mul(K);
    for lane in lanes {
        h = (h ^ lane).wrapping_mul(K).rotate_left(31);
    }
    for (i, &x) in blocks.remainder().iter().enumerate() {
        h = (h ^ ((x as u64) << ((i % 8) * 8))).wrapping_mul(K).rotate_left(7);
    }
    h ^ (h >> 29)
}

/// FNV-1a 64, a byte at a time: the commit-slot checksum of `vectors.f32` (its header layout
/// is fixed by format version 1) and the checksum of `clusters.bin` version 1, read only.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// FNV-1a over 8-byte little-endian words (the tail bytes one by one): the checksum of
/// `clusters.bin` version 2, read only.
pub fn fnv1a_words(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    let words = bytes.chunks_exact(8);
    let tail = words.remainder();
    for w in words {
        h ^= u64::from_le_bytes(w.try_into().unwrap());
        h = h.wrapping_mul(0x100000001b3);
    }
    for &b in tail {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// A file image being built, little endian.
pub struct Writer {
    b: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(n: usize) -> Self {
        Writer { b: Vec::with_capacity(n) }
    }

    #[inline]
    pub fn put<T: Le>(&mut self, v: T) {
        v.put(&mut self.b);
    }

    /// The numbers of `v` in order. On a little-endian target their memory is their encoding,
    /// so the slice is one copy rather than one push per number (per-number pushes were most
    /// of the time an organisation spent saving `clusters.bin`).
    pub fn put_slice<T: Le>(&mut self, v: &[T]) {
        if cfg!(target_endian = "little") {
            // SAFETY: `Le` types have no padding and every byte is a valid u8; the view covers
            // exactly the slice's memory and lives only for this copy.
            let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) };
            self.b.extend_from_slice(bytes);
        } else {
            v.iter().for_each(|&x| x.put(&mut self.b));
        }
    }

    /// A length-prefixed list: its length as u64, then its numbers.
    pub fn put_list<T: Le>(&mut self, v: &[T]) {
        self.put(v.len() as u64);
        self.put_slice(v);
    }

    /// Strings, each as its byte length (u32) and its UTF-8 bytes.
    pub fn put_strings(&mut self, v: &[String]) {
        for s in v {
            self.put(s.len() as u32);
            self.b.extend_from_slice(s.as_bytes());
        }
    }

    pub fn put_bytes(&mut self, b: &[u8]) {
        self.b.extend_from_slice(b);
    }

    /// The bytes so far, without a checksum (fixed-size records such as a header slot).
    pub fn into_bytes(self) -> Vec<u8> {
        self.b
    }

    /// The bytes so far followed by their `checksum`.
    pub fn finish(mut self) -> Vec<u8> {
        let sum = checksum(&self.b);
        self.put(sum);
        self.b
    }
}

/// The error of a damaged file: "corrupt <what>: <why>".
pub fn corrupt(what: &str, why: &str) -> Error {
    Error::Io(format!("corrupt {what}: {why}"))
}

/// A cursor over a file image. Every read checks the bytes left, and counts read from the file
/// are checked against them before anything is allocated, so a damaged file is an `Io` error
/// ("corrupt <what>: ..."), never a panic or a huge allocation.
pub struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader of `b` from its start; `what` names the file kind in errors.
    pub fn new(b: &'a [u8], what: &'static str) -> Self {
        Reader { b, at: 0, what }
    }

    /// An `Io` error saying the file is corrupt and why.
    pub fn corrupt(&self, why: &str) -> Error {
        corrupt(self.what, why)
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() - self.at < n {
            return Err(self.corrupt("truncated"));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    #[inline]
    pub fn get<T: Le>(&mut self) -> Result<T> {
        Ok(T::get(self.take(T::SIZE)?))
    }

    /// `n` items of `size` bytes, `n` checked against the bytes left first.
    pub fn items(&mut self, n: u64, size: usize) -> Result<&'a [u8]> {
        let left = (self.b.len() - self.at) as u64;
        if n > left / size.max(1) as u64 {
            return Err(self.corrupt("a count larger than the file"));
        }
        self.take(n as usize * size)
    }

    /// `n` numbers (the mirror of `Writer::put_slice`).
    pub fn vec<T: Le>(&mut self, n: u64) -> Result<Vec<T>> {
        let bytes = self.items(n, T::SIZE)?;
        let n = n as usize;
        if cfg!(target_endian = "little") {
            let mut v: Vec<T> = Vec::with_capacity(n);
            // SAFETY: `bytes` holds exactly n * SIZE bytes, the buffer has room for n values,
            // the regions are distinct, and every bit pattern is a valid `T` (`Le`).
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, bytes.len());
                v.set_len(n);
            }
            Ok(v)
        } else {
            Ok(bytes.chunks_exact(T::SIZE).map(T::get).collect())
        }
    }

    /// A length-prefixed list (the mirror of `Writer::put_list`).
    pub fn list<T: Le>(&mut self) -> Result<Vec<T>> {
        let n = self.get::<u64>()?;
        self.vec(n)
    }

    /// `n` strings (the mirror of `Writer::put_strings`).
    pub fn strings(&mut self, n: u64) -> Result<Vec<String>> {
        // Each string takes at least its 4-byte length: a count beyond that is corrupt.
        if n > (self.b.len() - self.at) as u64 / 4 {
            return Err(self.corrupt("a count larger than the file"));
        }
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let len = self.get::<u32>()? as u64;
            let s = std::str::from_utf8(self.items(len, 1)?).map_err(|_| self.corrupt("a string is not UTF-8"))?;
            out.push(s.to_owned());
        }
        Ok(out)
    }

    /// Bytes not read yet.
    pub fn left(&self) -> usize {
        self.b.len() - self.at
    }

    /// Error unless every byte was read.
    pub fn end(&self) -> Result<()> {
        if self.at != self.b.len() {
            return Err(self.corrupt("trailing bytes"));
        }
        Ok(())
    }
}

/// A checksum function, as a format's version table names it.
pub type Checksum = fn(&[u8]) -> u64;

/// A checksummed file format (framing in the module comment).
pub struct Format {
    pub magic: [u8; 8],
    /// Names the file kind in errors ("cluster state", "lexical index").
    pub what: &'static str,
    /// Every version this build reads with the checksum it was written with, oldest first;
    /// the last one is the version written, with `checksum`.
    pub versions: &'static [(u32, Checksum)],
}

impl Format {
    /// The version written.
    pub fn version(&self) -> u32 {
        self.versions[self.versions.len() - 1].0
    }

    /// A writer that has written the magic and the current version; `Writer::finish` then
    /// appends the checksum.
    pub fn writer(&self, capacity: usize) -> Writer {
        let mut w = Writer::with_capacity(capacity + 20);
        w.put_bytes(&self.magic);
        w.put(self.version());
        w
    }

    /// Check the magic, the version and the checksum of a file image; returns the version
    /// and a reader of the bytes between the version and the checksum.
    pub fn open<'a>(&self, b: &'a [u8]) -> Result<(u32, Reader<'a>)> {
        if b.len() < 8 + 4 + 8 || b[..8] != self.magic {
            return Err(Error::Io(format!("not a clag_fast {} file (bad magic or too short)", self.what)));
        }
        let (body, tail) = b.split_at(b.len() - 8);
        let version = u32::get(&body[8..12]);
        let Some(&(_, sum)) = self.versions.iter().find(|v| v.0 == version) else {
            let known: Vec<String> = self.versions.iter().map(|v| v.0.to_string()).collect();
            return Err(Error::Io(format!(
                "{} version {version} is not supported (this build reads {})",
                self.what,
                known.join(", ")
            )));
        };
        let mut r = Reader::new(body, self.what);
        if sum(body) != u64::get(tail) {
            return Err(r.corrupt("checksum mismatch"));
        }
        r.at = 12;
        Ok((version, r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of a file image `TEST` must refuse.
    fn refused(b: &[u8]) -> String {
        match TEST.open(b) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a damaged image was accepted"),
        }
    }

    const TEST: Format = Format { magic: *b"CLAGTST\0", what: "test file", versions: &[(1, fnv1a), (2, checksum)] };

    #[test]
    fn numbers_lists_and_strings_round_trip() {
        let mut w = TEST.writer(64);
        w.put(7u8);
        w.put(-3i64);
        w.put_slice(&[1.5f32, -0.25]);
        w.put_list(&[u16::MAX, 0, 9]);
        w.put_list::<f64>(&[]);
        w.put_strings(&["ab".to_owned(), "東京".to_owned()]);
        let b = w.finish();
        let (v, mut r) = TEST.open(&b).unwrap();
        assert_eq!(v, 2);
        assert_eq!(r.get::<u8>().unwrap(), 7);
        assert_eq!(r.get::<i64>().unwrap(), -3);
        assert_eq!(r.vec::<f32>(2).unwrap(), [1.5, -0.25]);
        assert_eq!(r.list::<u16>().unwrap(), [u16::MAX, 0, 9]);
        assert!(r.list::<f64>().unwrap().is_empty());
        assert_eq!(r.strings(2).unwrap(), ["ab", "東京"]);
        r.end().unwrap();
    }

    #[test]
    fn damage_is_an_error_naming_the_file_kind() {
        let mut w = TEST.writer(8);
        w.put_list(&[1u32, 2, 3]);
        let b = w.finish();
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x20;
            let e = refused(&bad);
            assert!(e.contains("test file"), "{e}");
        }
        for n in 0..b.len() {
            assert!(TEST.open(&b[..n]).is_err());
        }
        // A count past the end of the file fails before allocating.
        let mut w = TEST.writer(8);
        w.put(u64::MAX / 2);
        let b = w.finish();
        let (_, mut r) = TEST.open(&b).unwrap();
        assert!(r.list::<u64>().unwrap_err().to_string().contains("corrupt test file: a count larger"));
        let (_, mut r) = TEST.open(&b).unwrap();
        assert!(r.strings(1 << 40).is_err());
        let (_, r) = TEST.open(&b).unwrap();
        assert!(r.end().is_err());
    }

    #[test]
    fn older_versions_use_their_own_checksum() {
        let mut v1 = b"CLAGTST\0".to_vec();
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&5u32.to_le_bytes());
        let sum = fnv1a(&v1);
        v1.extend_from_slice(&sum.to_le_bytes());
        let (v, mut r) = TEST.open(&v1).unwrap();
        assert_eq!((v, r.get::<u32>().unwrap()), (1, 5));
        // The current version with the old checksum is corrupt.
        v1[8] = 2;
        let sum = fnv1a(&v1[..v1.len() - 8]);
        let n = v1.len();
        v1[n - 8..].copy_from_slice(&sum.to_le_bytes());
        assert!(refused(&v1).contains("checksum mismatch"));
        v1[8] = 3;
        assert!(refused(&v1).contains("version 3 is not supported (this build reads 1, 2)"));
    }

    #[test]
    fn checksum_values_are_fixed() {
        // Files on disk carry these sums: the functions must never change.
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a_words(b"abcdefghi"), {
            let mut h = (0xcbf29ce484222325u64 ^ u64::from_le_bytes(*b"abcdefgh")).wrapping_mul(0x100000001b3);
            h ^= b'i' as u64;
            h.wrapping_mul(0x100000001b3)
        });
        let b: Vec<u8> = (0..100u8).collect();
        assert_eq!(checksum(&b), 0x6228_3cd5_363e_84f1);
    }
}
