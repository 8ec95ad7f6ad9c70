//! Reading a push source: a single file or a directory tree, walked in a stable order.

use crate::error::{Result, StoreError};
use crate::format::manifest::EntryKind;
use bytes::Bytes;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// One entry found under the source.
#[derive(Debug, Clone)]
pub struct SourceEntry {
    /// Path relative to the source root, `/`-separated.
    pub rel: String,
    /// Path on disk.
    pub abs: PathBuf,
    /// Entry type.
    pub kind: EntryKind,
    /// Permission bits.
    pub mode: u32,
    /// Size in bytes (files).
    pub size: u64,
    /// Symlink target.
    pub target: Option<String>,
}

impl SourceEntry {
    /// A regular file of `size` bytes held in memory, at `rel` in the image (mode 0644).
    pub fn in_memory(rel: &str, size: u64) -> SourceEntry {
        SourceEntry {
            rel: rel.to_string(),
            abs: PathBuf::from(rel),
            kind: EntryKind::File,
            mode: 0o644,
            size,
            target: None,
        }
    }
}

fn utf8(p: &Path) -> Result<String> {
    p.to_str().map(str::to_string).ok_or_else(|| StoreError::Path {
        path: p.to_path_buf(),
        why: "not valid UTF-8; gstore stores UTF-8 paths only".into(),
    })
}

/// The entry at `abs`; a symlink is kept as a symlink unless `follow` is set.
fn entry(abs: PathBuf, rel: String, follow: bool) -> Result<SourceEntry> {
    let md = if follow { std::fs::metadata(&abs) } else { std::fs::symlink_metadata(&abs) }
        .map_err(|e| StoreError::io("reading", &abs, e))?;
    let ft = md.file_type();
    let mode = md.permissions().mode() & 0o7777;
    let (kind, size, target) = if ft.is_file() {
        (EntryKind::File, md.len(), None)
    } else if ft.is_dir() {
        (EntryKind::Dir, 0, None)
    } else if ft.is_symlink() {
        let t = std::fs::read_link(&abs).map_err(|e| StoreError::io("reading link", &abs, e))?;
        (EntryKind::Symlink, 0, Some(utf8(&t)?))
    } else {
        return Err(StoreError::Path {
            path: abs,
            why: "not a regular file, directory or symlink; gstore cannot store it".into(),
        });
    };
    Ok(SourceEntry { rel, abs, kind, mode, size, target })
}

/// Walks `root`: a single file gives one entry named after it; a directory gives every entry
/// below it (not itself), parents before children, siblings sorted by name. One rule for
/// symlinks: `root` itself is followed when it is one (a link to a file stores the file, a
/// link to a directory the directory's entries); symlinks below `root` are stored as symlinks.
pub fn scan(root: &Path) -> Result<Vec<SourceEntry>> {
    let md = std::fs::metadata(root).map_err(|e| StoreError::io("reading source", root, e))?;
    if !md.is_dir() {
        let name = root
            .file_name()
            .ok_or_else(|| StoreError::Path { path: root.to_path_buf(), why: "no file name".into() })?;
        return Ok(vec![entry(root.to_path_buf(), utf8(Path::new(name))?, true)?]);
    }
    let mut out = Vec::new();
    walk(root, "", &mut out)?;
    Ok(out)
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<SourceEntry>) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| StoreError::io("reading directory", dir, e))?;
    let mut names = Vec::new();
    for item in rd {
        let item = item.map_err(|e| StoreError::io("reading directory", dir, e))?;
        names.push(item.file_name());
    }
    names.sort();
    for name in names {
        let abs = dir.join(&name);
        let rel = format!("{prefix}{}", utf8(Path::new(&name))?);
        let e = entry(abs.clone(), rel.clone(), false)?;
        let is_dir = e.kind == EntryKind::Dir;
        out.push(e);
        if is_dir {
            walk(&abs, &format!("{rel}/"), out)?;
        }
    }
    Ok(())
}

/// One piece of one file, processed as a whole on one core.
pub(crate) struct Unit {
    pub(crate) file: usize,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    /// A piece of a page image: its changed chunks are worth storing as deltas.
    pub(crate) page_image: bool,
    /// The unit's bytes: a streamed piece's as they came, a file's if read ahead of
    /// processing (`push::read_ahead`; else the worker reads it).
    pub(crate) data: Option<Bytes>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_symlink_is_followed_and_links_below_are_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let (file, dir) = (tmp.path().join("file"), tmp.path().join("dir"));
        std::fs::write(&file, b"twelve bytes").unwrap();
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&file, dir.join("inner")).unwrap();
        std::os::unix::fs::symlink(&file, tmp.path().join("to-file")).unwrap();
        std::os::unix::fs::symlink(&dir, tmp.path().join("to-dir")).unwrap();
        let f = scan(&tmp.path().join("to-file")).unwrap();
        assert_eq!((f.len(), f[0].rel.as_str(), f[0].kind, f[0].size), (1, "to-file", EntryKind::File, 12));
        let d = scan(&tmp.path().join("to-dir")).unwrap();
        assert_eq!((d.len(), d[0].rel.as_str(), d[0].kind), (1, "inner", EntryKind::Symlink));
        assert_eq!(d[0].target.as_deref(), file.to_str());
    }
}
