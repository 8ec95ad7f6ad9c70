//! The node agent (`gstore watch DIR`): container checkpoint archives that land in a
//! directory are stored entry by entry once each is complete. On Kubernetes the directory is
//! the kubelet's `/var/lib/kubelet/checkpoints/` (its checkpoint API, KEP-2008), where each
//! archive is `checkpoint-<pod>_<namespace>-<container>-<RFC 3339 time>.tar`; the image is
//! tagged `<prefix><pod>_<namespace>-<container>:<time>` ([`tag_for`]).
//!
//! An archive counts once it is complete: its name says so (writers write under another name
//! and rename, as the kubelet does), and it has not changed for a while ([`Options::settle`]),
//! for a writer that writes in place. An archive cut short fails its push (a truncated tar)
//! and nothing is tagged; it is tried again only once it changes. The image records which
//! archive it came from (`source_archive`: name, size, modification time), so a watcher
//! started again, after a crash or a kill at any moment, stores nothing twice: an archive
//! whose tag already names an image of that archive is done (and removed, if asked).

use crate::archive;
use crate::{ContainerError, Result};
use gstore_store::format::meta::{ImageMeta, SourceArchive};
use gstore_store::progress::Silent;
use gstore_store::{IndexedStore, TagRef};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The longest tag name ([`gstore_store::TagRef`]'s parts).
const NAME_MAX: usize = 128;

/// How the directory is watched.
#[derive(Clone, Debug)]
pub struct Options {
    /// The directory archives land in.
    pub dir: PathBuf,
    /// What each tag name starts with.
    pub prefix: String,
    /// Remove an archive once it is stored.
    pub remove: bool,
    /// How long an archive must be unchanged before it is taken in.
    pub settle: Duration,
}

/// An archive in the directory, complete by its name and age.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its path.
    pub path: PathBuf,
    /// Its file name.
    pub name: String,
    /// Its length in bytes.
    pub size: u64,
    /// Its modification time, in nanoseconds since the Unix epoch.
    pub modified_ns: u128,
}

impl Found {
    /// What the image records of the archive it came from.
    fn identity(&self) -> SourceArchive {
        SourceArchive { name: self.name.clone(), size: self.size, modified_ns: self.modified_ns.to_string() }
    }
}

/// What became of one archive: a JSON line of `gstore --json watch`.
#[derive(Clone, Debug, Serialize)]
pub struct Taken {
    /// The archive's file name.
    pub archive: String,
    /// The tag it is stored under.
    pub tag: String,
    /// `stored`, `already stored` (by an earlier run) or `failed`.
    pub outcome: &'static str,
    /// The image's id, when stored.
    pub manifest: Option<String>,
    /// The archive's length in bytes.
    pub bytes: u64,
    /// Bytes the store gained.
    pub stored_bytes: u64,
    /// Seconds it took.
    pub seconds: f64,
    /// Whether the archive was removed.
    pub removed: bool,
    /// Why it failed.
    pub error: Option<String>,
}

/// Whether `name` is a checkpoint archive's final name (`checkpoint-*.tar`, or `.tar.gz`,
/// `.tar.zst`), not a file being written (hidden, or another suffix).
fn is_archive_name(name: &str) -> bool {
    name.starts_with("checkpoint-") && [".tar", ".tar.gz", ".tar.zst"].iter().any(|s| name.ends_with(s))
}

/// The complete archives in `opts.dir`, oldest first.
pub fn scan(opts: &Options) -> std::io::Result<Vec<Found>> {
    let now = SystemTime::now();
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&opts.dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() || !is_archive_name(&name) {
            continue;
        }
        let modified = meta.modified()?;
        if now.duration_since(modified).unwrap_or_default() < opts.settle {
            continue;
        }
        let modified_ns = modified.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
        found.push(Found { path: entry.path(), name, size: meta.len(), modified_ns });
    }
    found.sort_by(|a, b| (a.modified_ns, &a.name).cmp(&(b.modified_ns, &b.name)));
    Ok(found)
}

/// The tag of archive `name` (`checkpoint-<pod>_<namespace>-<container>-<time>.tar`):
/// `<prefix><pod>_<namespace>-<container>:<time>`, the time's digits and `T`/`Z` kept
/// (`2026-11-28T22:44:00Z` → `20261128T224400Z`), other characters a tag cannot hold made
/// `-`, and a name too long for a tag cut, with 8 hex digits of its hash so that two stay
/// apart. A name without a time takes `modified` (seconds since the epoch) as its version.
pub fn tag_for(name: &str, prefix: &str, modified_s: u64) -> Result<TagRef> {
    let stem = name.strip_prefix("checkpoint-").unwrap_or(name);
    let stem = [".tar.gz", ".tar.zst", ".tar"].iter().find_map(|s| stem.strip_suffix(s)).unwrap_or(stem);
    let (what, version) = match time_at(stem) {
        Some(at) => {
            let time: String = stem[at + 1..]
                .chars()
                .filter_map(|c| match c {
                    '0'..='9' | 'T' | 'Z' => Some(c),
                    '+' => Some('p'),
                    '.' => Some('.'),
                    _ => None,
                })
                .collect();
            (&stem[..at], time)
        }
        None => (stem, modified_s.to_string()),
    };
    let clean = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '-' }).collect()
    };
    let mut tag_name = format!("{prefix}{}", clean(what)).trim_start_matches(['.', '-']).to_string();
    if tag_name.len() > NAME_MAX {
        let hash = blake3::hash(tag_name.as_bytes()).to_hex();
        tag_name = format!("{}-{}", &tag_name[..NAME_MAX - 9], &hash[..8]);
    }
    if tag_name.is_empty() {
        tag_name = "checkpoint".into();
    }
    Ok(TagRef::from_parts(&tag_name, &version)?)
}

/// Where the RFC 3339 time at the end of `stem` begins (the `-` before it): `-YYYY-MM-DDT…`.
fn time_at(stem: &str) -> Option<usize> {
    let b = stem.as_bytes();
    (0..b.len()).rev().find(|&i| {
        let at = |k: usize| b.get(i + k).copied();
        let digits = |from: usize, n: usize| (from..from + n).all(|k| at(k).is_some_and(|c| c.is_ascii_digit()));
        at(0) == Some(b'-')
            && digits(1, 4)
            && at(5) == Some(b'-')
            && digits(6, 2)
            && at(8) == Some(b'-')
            && digits(9, 2)
            && at(11) == Some(b'T')
    })
}

/// Takes archive `found` into the store as its tag ([`tag_for`]), unless its tag already
/// names an image of this very archive; then removes it if `opts.remove`. Never fails: what
/// went wrong is in the answer, and nothing is tagged.
pub fn take_in(store: &IndexedStore, found: &Found, opts: &Options) -> Taken {
    let started = Instant::now();
    let mut taken = Taken {
        archive: found.name.clone(),
        tag: String::new(),
        outcome: "failed",
        manifest: None,
        bytes: found.size,
        stored_bytes: 0,
        seconds: 0.0,
        removed: false,
        error: None,
    };
    match store_once(store, found, opts, &mut taken) {
        Ok(()) if opts.remove => match std::fs::remove_file(&found.path) {
            Ok(()) => taken.removed = true,
            Err(e) => taken.error = Some(format!("stored, but removing {}: {e}", found.path.display())),
        },
        Ok(()) => {}
        Err(e) => taken.error = Some(e.to_string()),
    }
    taken.seconds = started.elapsed().as_secs_f64();
    taken
}

/// Stores `found` unless an earlier run did, filling in `taken`.
fn store_once(store: &IndexedStore, found: &Found, opts: &Options, taken: &mut Taken) -> Result<()> {
    let modified_s = (found.modified_ns / 1_000_000_000) as u64;
    let tag = tag_for(&found.name, &opts.prefix, modified_s)?;
    taken.tag = tag.to_string();
    if let Some(rec) = store.get_tag(&tag)? {
        let id = rec.manifest_id()?;
        if store.get_manifest(&id)?.meta.source_archive == Some(found.identity()) {
            taken.outcome = "already stored";
            taken.manifest = Some(id.to_hex());
            return Ok(());
        }
    }
    let meta = ImageMeta { source_archive: Some(found.identity()), ..ImageMeta::default() };
    let file = std::fs::File::open(&found.path).map_err(|e| ContainerError::io("opening", &found.path, e))?;
    let what = found.path.display().to_string();
    let input = std::io::BufReader::with_capacity(1 << 20, file);
    let (report, _) = archive::push_archive(store, input, &what, &tag, meta, &Silent)?;
    taken.outcome = "stored";
    taken.manifest = Some(report.manifest.to_hex());
    taken.stored_bytes = report.new_stored_bytes;
    Ok(())
}

/// Writes `text` to `path` whole: a temporary file beside it, renamed over it.
pub fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_names_make_tags_by_pod_container_and_time() {
        let t = tag_for("checkpoint-web-5d8f_default-nginx-2026-11-28T22:44:00Z.tar", "k8s-", 0).unwrap();
        assert_eq!(t.to_string(), "k8s-web-5d8f_default-nginx:20261128T224400Z");
        let t = tag_for("checkpoint-a_b-c-2026-01-02T03:04:05+01:00.tar.zst", "", 0).unwrap();
        assert_eq!(t.to_string(), "a_b-c:20260102T030405p0100");
        let t = tag_for("checkpoint-odd name.tar", "k8s-", 1234).unwrap();
        assert_eq!(t.to_string(), "k8s-odd-name:1234", "no time: the file's");
        let long = format!("checkpoint-{}_ns-c-2026-11-28T22:44:00Z.tar", "p".repeat(300));
        let (a, b) = (tag_for(&long, "", 0).unwrap(), tag_for(&long.replace("_ns", "_nt"), "", 0).unwrap());
        assert!(a.name.len() <= NAME_MAX && a.name != b.name, "{a} {b}");
    }

    #[test]
    fn only_complete_archives_by_name_and_age_are_found() {
        let dir = tempfile::tempdir().unwrap();
        for name in
            ["checkpoint-a_b-c-2026-11-28T22:44:00Z.tar", ".checkpoint-x.tar.tmp", "checkpoint-y.tar.part", "other.tar"]
        {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let opts =
            Options { dir: dir.path().into(), prefix: String::new(), remove: false, settle: Duration::from_secs(0) };
        let found = scan(&opts).unwrap();
        assert_eq!(
            found.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            ["checkpoint-a_b-c-2026-11-28T22:44:00Z.tar"]
        );
        let settled = Options { settle: Duration::from_secs(3600), ..opts };
        assert!(scan(&settled).unwrap().is_empty(), "a file still changing is left for later");
    }
}
