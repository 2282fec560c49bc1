//! Whole-file writes and reads for the derived state files (`clusters.bin`, `lexical.bin`).

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Atomically replace `path` with `bytes` (temp file, fsync, rename, fsync directory): a
/// crash leaves the old file or the new one, never a torn one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, true)
}

/// `write_atomic`, with the fsyncs only when `durable`: without them the replacement is
/// still atomic for a process that dies (rename), and after a power loss the file may be the
/// old one or unreadable, which the store treats as derived state to rebuild.
pub fn replace(path: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let io = |e: std::io::Error| Error::Io(format!("{}: {e}", tmp.display()));
    {
        let mut f = File::create(&tmp).map_err(io)?;
        f.write_all(bytes).map_err(io)?;
        if durable {
            f.sync_all().map_err(io)?;
        }
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    if durable {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Read `path` whole and decode it; I/O and decoding errors both name the file.
pub fn read_decoded<T>(path: &Path, decode: impl FnOnce(&[u8]) -> Result<T>) -> Result<T> {
    let b = std::fs::read(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    decode(&b).map_err(|e| Error::Io(format!("{}: {e}", path.display())))
}
