//! Container checkpoint archives: pushed entry by entry as they are read (a tar, plain, gzip
//! or zstd; from a file, a pipe or a FIFO), and written back from an image as a plain tar.
//!
//! Pushed entry by entry, an archive's CRIU page images (`checkpoint/pages-N.img`) get
//! page-level deltas against earlier checkpoints; pushed as one compressed blob they would
//! share almost nothing. The tar written back is generated the same way every time from the
//! image alone (entries in the image's order, owner 0:0, modification time 0), so the same
//! image always gives the same bytes.

use crate::error::{ContainerError, Result};
use gstore_restore::cat::FileIndex;
use gstore_store::commands::push::stream::{self, StreamSink};
use gstore_store::commands::push::PushReport;
use gstore_store::format::manifest::{EntryKind, Manifest};
pub use gstore_store::format::meta::ContainerMeta;
use gstore_store::format::meta::{ImageMeta, Kind};
use gstore_store::progress::{Progress, Unit};
use gstore_store::{IndexedStore, StoreError, TagRef};
use serde::Serialize;
use std::io::{Read, Write};

/// How an archive's bytes are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip (`.tar.gz`).
    Gzip,
    /// zstd (`.tar.zst`, podman's default).
    Zstd,
}

impl Compression {
    /// The compression whose magic number `head` starts with (a plain tar has none).
    fn sniff(head: &[u8]) -> Compression {
        match head {
            [0x1f, 0x8b, ..] => Compression::Gzip,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
            _ => Compression::None,
        }
    }
}

/// `r` decompressed, whatever its compression, and which it was.
pub fn decompressed<'a>(mut r: impl Read + 'a, what: &str) -> Result<(Box<dyn Read + 'a>, Compression)> {
    let mut head = Vec::with_capacity(4);
    (&mut r).take(4).read_to_end(&mut head).map_err(|e| bad(what, format!("cannot read it: {e}")))?;
    let compression = Compression::sniff(&head);
    let whole = std::io::Cursor::new(head).chain(r);
    let plain: Box<dyn Read + 'a> = match compression {
        Compression::None => Box::new(whole),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(whole)),
        Compression::Zstd => {
            Box::new(zstd::stream::read::Decoder::new(whole).map_err(|e| bad(what, format!("not a zstd stream: {e}")))?)
        }
    };
    Ok((plain, compression))
}

fn bad(what: &str, why: String) -> ContainerError {
    ContainerError::BadArchive { what: what.to_string(), why }
}

/// Whether an entry's path marks a container checkpoint archive (podman's or the kubelet's).
fn marks_checkpoint(path: &str) -> bool {
    matches!(path, "config.dump" | "spec.dump" | "checkpoint") || path.starts_with("checkpoint/")
}

/// Whether the file at `path` is a container checkpoint archive: a tar (of any compression)
/// among whose first entries are `config.dump`, `spec.dump` or `checkpoint/`. Reads at most
/// 64 MiB of it; any file that is not such an archive is `false`.
pub fn is_checkpoint_archive(path: &std::path::Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else { return false };
    let Ok((plain, _)) = decompressed(std::io::BufReader::new(file), "") else { return false };
    let mut archive = tar::Archive::new(plain.take(64 << 20));
    let Ok(entries) = archive.entries() else { return false };
    for entry in entries.take(16) {
        let Ok(entry) = entry else { return false };
        let Ok(p) = entry.path() else { return false };
        if marks_checkpoint(&normalized(&p.to_string_lossy())) {
            return true;
        }
    }
    false
}

/// `p` as an image path: no leading `./` or `/`, no trailing `/` (`""` for the root).
fn normalized(p: &str) -> String {
    let mut s = p.trim_start_matches("./").trim_start_matches('/');
    while let Some(rest) = s.strip_prefix("./") {
        s = rest;
    }
    s.trim_end_matches('/').to_string()
}

/// What an archive held besides its files.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ArchiveInfo {
    /// The archive's compression (as read).
    pub compression: Option<Compression>,
    /// Bytes of tar read (after decompression).
    pub tar_bytes: u64,
    /// Whether it is a container checkpoint (it holds `config.dump`, `spec.dump` or
    /// `checkpoint/`).
    pub checkpoint: bool,
    /// The container it is a checkpoint of, from its `config.dump`.
    pub container: Option<ContainerMeta>,
}

/// The checkpointed container a `config.dump` describes (podman: `rootfsImageID` /
/// `rootfsImageName`; CRI-O: `rootfsImageRef` / `rootfsImageName`), as the image records it;
/// `None` if it is not JSON.
fn container_of(config_dump: &[u8]) -> Option<ContainerMeta> {
    let v: serde_json::Value = serde_json::from_slice(config_dump).ok()?;
    let s =
        |keys: &[&str]| keys.iter().find_map(|k| v.get(*k).and_then(|x| x.as_str())).unwrap_or_default().to_string();
    Some(ContainerMeta {
        name: s(&["name"]),
        id: s(&["id"]),
        image: s(&["rootfsImageName", "rootfsImage"]),
        image_id: s(&["rootfsImageID", "rootfsImageRef"]),
        runtime: s(&["runtime", "OCIRuntime"]),
    })
}

/// A reader that notes whether its source ever ran dry: a tar whose reader stops at the end of
/// its input instead of at the end-of-archive blocks was cut short.
struct EndWatch<R> {
    inner: R,
    bytes: u64,
    ran_dry: bool,
}

impl<R: Read> Read for EndWatch<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.ran_dry = true;
        }
        self.bytes += n as u64;
        Ok(n)
    }
}

/// The largest `config.dump` read into memory to describe the container.
const CONFIG_DUMP_MAX: u64 = 16 << 20;

/// Feeds every entry of the tar in `input` to `sink` and finishes it with `meta` (plus what
/// the archive says of itself). Regular files, directories and symlinks only; anything else,
/// an unsafe path, or an archive cut short is an error, and the sink is dropped unfinished so
/// that nothing is tagged.
pub fn feed(sink: StreamSink, input: impl Read, what: &str, mut meta: ImageMeta) -> Result<ArchiveInfo> {
    let (plain, compression) = decompressed(input, what)?;
    let mut watch = EndWatch { inner: plain, bytes: 0, ran_dry: false };
    let mut info = ArchiveInfo { compression: Some(compression), ..ArchiveInfo::default() };
    let mut archive = tar::Archive::new(&mut watch);
    let entries = archive.entries().map_err(|e| bad(what, format!("not a tar archive: {e}")))?;
    let mut any = false;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(what, format!("not a tar archive, or a damaged one: {e}")))?;
        any = true;
        let raw = entry.path().map_err(|e| bad(what, format!("an entry's path is not usable: {e}")))?;
        let path = normalized(&raw.to_string_lossy());
        if path.is_empty() {
            continue;
        }
        info.checkpoint |= marks_checkpoint(&path);
        let mode = entry.header().mode().map_err(|e| bad(what, format!("{path}: {e}")))? & 0o7777;
        let fed = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mut file = sink.file(&path, mode)?;
                if path == "config.dump" && entry.size() <= CONFIG_DUMP_MAX {
                    let mut bytes = Vec::with_capacity(entry.size() as usize);
                    entry.read_to_end(&mut bytes).map_err(|e| bad(what, format!("{path}: {e}")))?;
                    info.container = container_of(&bytes);
                    file.read_from(&mut &bytes[..])
                } else {
                    file.read_from(&mut entry)
                }
            }
            tar::EntryType::Directory => sink.dir(&path, mode).map(|_| 0),
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| bad(what, format!("{path}: {e}")))?
                    .ok_or_else(|| bad(what, format!("symlink {path} has no target")))?;
                sink.symlink(&path, &target.to_string_lossy()).map(|_| 0)
            }
            other => {
                return Err(bad(
                    what,
                    format!("{path} is a {other:?} entry; gstore stores files, directories and symlinks"),
                ))
            }
        };
        fed.map_err(|e| match e {
            // A read error of the entry's bytes is the archive's, not the store's.
            StoreError::Io { source, .. } => bad(what, format!("{path}: {source}")),
            e => ContainerError::Store(e),
        })?;
    }
    if !any {
        return Err(bad(what, "not a tar archive (no entries)".into()));
    }
    if watch.ran_dry {
        return Err(bad(what, "the archive is cut short (it ends without tar's end-of-archive blocks)".into()));
    }
    info.tar_bytes = watch.bytes;
    // Whatever follows the end of the tar (podman's `--export=/dev/stdout` writes the
    // container's name after it) is read and dropped: a writer left with unread bytes in a
    // pipe dies of SIGPIPE, and `set -o pipefail` fails the pipeline. An error reading past
    // the end (a compressed stream followed by other bytes) is no error of the archive.
    let _ = std::io::copy(&mut watch, &mut std::io::sink());
    if info.checkpoint {
        meta.kind = Some(Kind::ContainerCheckpoint);
    }
    if let Some(c) = &info.container {
        meta.container = Some(c.clone());
    }
    sink.finish(meta)?;
    Ok(info)
}

/// Pushes the archive read from `input` as image `tag` (`what` names the input in errors),
/// entry by entry while it is read. A container checkpoint archive gets `kind`
/// `container-checkpoint` and its container's description in the image's metadata.
pub fn push_archive(
    store: &IndexedStore,
    input: impl Read,
    what: &str,
    tag: &TagRef,
    meta: ImageMeta,
    progress: &dyn Progress,
) -> Result<(PushReport, ArchiveInfo)> {
    tag.check_new()?;
    stream::push_fed(store, tag, 256 << 20, progress, |sink| feed(sink, input, what, meta))
}

/// What writing an archive did.
#[derive(Clone, Debug, Serialize)]
pub struct WriteReport {
    /// Entries written.
    pub entries: usize,
    /// Bytes of the files written (the tar adds headers and padding).
    pub logical_bytes: u64,
    /// Bytes of tar written.
    pub tar_bytes: u64,
}

/// A writer that counts what passes through it.
pub struct Counting<W> {
    /// Where the bytes go.
    pub inner: W,
    /// How many went.
    pub bytes: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes image `m` to `out` as a plain tar (`what` names `out` in errors): its entries in the
/// image's order, owner 0:0, modification time 0, so the same image always gives the same
/// bytes. Every chunk is checked against its id before any of its bytes are written.
pub fn write_archive(
    store: &IndexedStore,
    m: &Manifest,
    out: impl Write,
    what: &str,
    progress: &dyn Progress,
) -> Result<WriteReport> {
    let io = |e: std::io::Error| ContainerError::io("writing", what, e);
    let logical: u64 = m.entries.iter().filter(|e| e.kind == EntryKind::File).map(|e| e.size).sum();
    progress.start("writing archive", logical, Unit::Bytes);
    let mut tar = tar::Builder::new(Counting { inner: out, bytes: 0 });
    let files = FileIndex::of(m);
    for e in &m.entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(e.mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        match e.kind {
            EntryKind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                tar.append_data(&mut h, format!("{}/", e.path), std::io::empty()).map_err(io)?;
            }
            EntryKind::Symlink => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                tar.append_link(&mut h, &e.path, e.target.as_deref().unwrap_or_default()).map_err(io)?;
            }
            EntryKind::File => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(e.size);
                let (reader, _) = files.open(store, &e.path)?;
                let mut reader = Advancing { inner: reader, progress };
                tar.append_data(&mut h, &e.path, &mut reader).map_err(|e| match e.downcast::<StoreError>() {
                    Ok(s) => ContainerError::Store(s),
                    Err(e) => io(e),
                })?;
            }
        }
    }
    let mut counted = tar.into_inner().map_err(io)?;
    counted.flush().map_err(io)?;
    progress.finish();
    Ok(WriteReport { entries: m.entries.len(), logical_bytes: logical, tar_bytes: counted.bytes })
}

/// A reader that advances a progress bar by what it reads.
struct Advancing<'a, R> {
    inner: R,
    progress: &'a dyn Progress,
}

impl<R: Read> Read for Advancing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.advance(n as u64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_is_told_by_magic_numbers() {
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]), Compression::Zstd);
        assert_eq!(Compression::sniff(b"chec"), Compression::None);
        assert_eq!(Compression::sniff(&[]), Compression::None);
    }

    #[test]
    fn paths_lose_dot_slashes_and_trailing_slashes() {
        assert_eq!(normalized("./checkpoint/"), "checkpoint");
        assert_eq!(normalized("././a/b"), "a/b");
        assert_eq!(normalized("/abs/x"), "abs/x");
        assert_eq!(normalized("./"), "");
    }

    #[test]
    fn podman_and_crio_config_dumps_name_the_base_image() {
        let podman = br#"{"id":"7f73","name":"ctr1","rootfsImageID":"2627","rootfsImageName":"localhost/bb:1","runtime":"runc"}"#;
        let c = container_of(podman).unwrap();
        assert_eq!((c.name.as_str(), c.image.as_str(), c.image_id.as_str()), ("ctr1", "localhost/bb:1", "2627"));
        let crio = br#"{"id":"ab","name":"k8s_ctr","rootfsImage":"docker.io/x:1","rootfsImageRef":"beef"}"#;
        let c = container_of(crio).unwrap();
        assert_eq!((c.image.as_str(), c.image_id.as_str()), ("docker.io/x:1", "beef"));
        assert!(container_of(b"not json").is_none());
    }
}
