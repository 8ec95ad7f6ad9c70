//! The store's key layout: every object a store holds, as one typed key. Keys are built
//! ([`fmt::Display`]) and parsed ([`ObjectKey::parse`]) here and nowhere else; a parse accepts
//! exactly the shapes the store writes, so a key from a listing or a request cannot name
//! anything outside the store's namespace (no `..`, no NUL, no unknown prefix).

use crate::id::ObjectId;
use crate::tag::TagRef;
use std::fmt;

/// An object of a store.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKey {
    /// `config.json`: the store's settings.
    Config,
    /// `packs/<first 2 hex>/<hex>.pack`.
    Pack(ObjectId),
    /// `manifests/<first 2 hex>/<hex>.manifest`.
    Manifest(ObjectId),
    /// `tags/<name>/<version>.tag`.
    Tag(TagRef),
    /// `profiles/<first 2 hex>/<manifest hex>.profile`: an image's restore profile.
    Profile(ObjectId),
    /// `leases/<32 lowercase hex>.lease`.
    Lease(String),
    /// `tombstones/<pack or manifest key>`: gc marked that object for deletion.
    Tombstone(Box<ObjectKey>),
    /// `gc/lock`: held by the one gc running.
    GcLock,
    /// `probe/<name>`: written and removed by `gstore init` to test conditional writes.
    Probe(String),
    /// `keys/<16 lowercase hex>.key`: a key record of an encrypted store.
    KeyRecord(String),
    /// `damage/<first 2 hex>/<pack hex>.json`: chunks `gstore verify --read-data` found damaged
    /// in that pack ([`crate::damage`]).
    Damage(ObjectId),
    /// `keys/retired.json`: the key records being removed (compare-and-swap writes make two
    /// removals at once see each other, so the last key is never removed).
    RetiredKeys,
    /// `policies.json`: the retention policies `gstore gc` applies by tag name.
    Policies,
    /// `uploads/<owner 16 hex>/...`: the registry's blob uploads ([`UploadKey`]).
    Upload(UploadKey),
}

/// An object of a registry blob upload: uploads live in the store, so any server over it
/// continues an upload another one started (docs/FORMAT.md). `owner` is the uploading
/// token's number, `id` the upload's 32 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UploadKey {
    /// `uploads/<owner>/<id>/in.<repo>` (empty): the upload was started in repository `repo`.
    Started { owner: u64, id: String, repo: String },
    /// `uploads/<owner>/<id>/<offset 16 hex>.part`: the upload's bytes from `offset`.
    Part { owner: u64, id: String, offset: u64 },
    /// `uploads/<owner>/<id>/<end 16 hex>.sha256`: the SHA-256 (64 hex digits) of the
    /// upload's bytes before `end`.
    Sha256 { owner: u64, id: String, end: u64 },
    /// `uploads/<owner>/staged/<sha256 hex>/<id>` (empty): upload `id` ended as that blob,
    /// which waits for a manifest.
    Staged { owner: u64, digest: String, id: String },
}

impl UploadKey {
    /// The owner whose upload this is.
    pub fn owner(&self) -> u64 {
        match self {
            UploadKey::Started { owner, .. }
            | UploadKey::Part { owner, .. }
            | UploadKey::Sha256 { owner, .. }
            | UploadKey::Staged { owner, .. } => *owner,
        }
    }

    /// The upload this object is of.
    pub fn id(&self) -> &str {
        match self {
            UploadKey::Started { id, .. }
            | UploadKey::Part { id, .. }
            | UploadKey::Sha256 { id, .. }
            | UploadKey::Staged { id, .. } => id,
        }
    }

    /// The prefix every upload object starts with (no trailing `/`).
    pub const PREFIX: &'static str = "uploads";

    /// The prefix of upload `id`'s bytes and records.
    pub fn upload_prefix(owner: u64, id: &str) -> String {
        format!("{}/{owner:016x}/{id}", Self::PREFIX)
    }

    /// The prefix of the staged blobs `owner` uploaded as `digest` (its hex).
    pub fn staged_prefix(owner: u64, digest: &str) -> String {
        format!("{}/{owner:016x}/staged/{digest}", Self::PREFIX)
    }

    fn parse(rest: &str) -> Option<UploadKey> {
        let hex_of = |s: &str, len: usize| (s.len() == len && is_lower_hex(s)).then(|| s.to_string());
        let number = |s: &str| hex_of(s, 16).and_then(|h| u64::from_str_radix(&h, 16).ok());
        let mut parts = rest.split('/');
        let owner = number(parts.next()?)?;
        let (second, third) = (parts.next()?, parts.next()?);
        let fourth = parts.next();
        if parts.next().is_some() {
            return None;
        }
        if second == "staged" {
            return Some(UploadKey::Staged { owner, digest: hex_of(third, 64)?, id: hex_of(fourth?, 32)? });
        }
        let id = hex_of(second, 32)?;
        if fourth.is_some() {
            return None;
        }
        if let Some(repo) = third.strip_prefix("in.") {
            TagRef::from_parts(repo, "latest").ok()?;
            return Some(UploadKey::Started { owner, id, repo: repo.to_string() });
        }
        if let Some(offset) = third.strip_suffix(".part").and_then(number) {
            return Some(UploadKey::Part { owner, id, offset });
        }
        let end = third.strip_suffix(".sha256").and_then(number)?;
        Some(UploadKey::Sha256 { owner, id, end })
    }
}

impl fmt::Display for UploadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UploadKey::Started { owner, id, repo } => write!(f, "{}/in.{repo}", Self::upload_prefix(*owner, id)),
            UploadKey::Part { owner, id, offset } => {
                write!(f, "{}/{offset:016x}.part", Self::upload_prefix(*owner, id))
            }
            UploadKey::Sha256 { owner, id, end } => write!(f, "{}/{end:016x}.sha256", Self::upload_prefix(*owner, id)),
            UploadKey::Staged { owner, digest, id } => write!(f, "{}/{id}", Self::staged_prefix(*owner, digest)),
        }
    }
}

/// The kinds of object that are listed by prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Packs.
    Packs,
    /// Manifests.
    Manifests,
    /// Tags.
    Tags,
    /// Restore profiles.
    Profiles,
    /// Leases.
    Leases,
    /// Tombstones.
    Tombstones,
    /// Key records.
    Keys,
    /// Damage records.
    Damage,
}

impl Family {
    /// The prefix every key of the family starts with (without the trailing `/`).
    pub const fn prefix(self) -> &'static str {
        match self {
            Family::Packs => "packs",
            Family::Manifests => "manifests",
            Family::Tags => "tags",
            Family::Profiles => "profiles",
            Family::Leases => "leases",
            Family::Tombstones => "tombstones",
            Family::Keys => "keys",
            Family::Damage => "damage",
        }
    }

    /// Every family, for servers that list what clients may list.
    pub const ALL: [Family; 8] = [
        Family::Packs,
        Family::Manifests,
        Family::Tags,
        Family::Profiles,
        Family::Leases,
        Family::Tombstones,
        Family::Keys,
        Family::Damage,
    ];
}

const CONFIG: &str = "config.json";
const GC_LOCK: &str = "gc/lock";
const RETIRED_KEYS: &str = "keys/retired.json";
const POLICIES: &str = "policies.json";
const PROBE: &str = "probe/";

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl ObjectKey {
    /// The tombstone of this key.
    pub fn tombstone(&self) -> ObjectKey {
        ObjectKey::Tombstone(Box::new(self.clone()))
    }

    /// The pack id, for a pack key.
    pub fn pack(&self) -> Option<ObjectId> {
        match self {
            ObjectKey::Pack(id) => Some(*id),
            _ => None,
        }
    }

    /// The manifest id, for a manifest key.
    pub fn manifest(&self) -> Option<ObjectId> {
        match self {
            ObjectKey::Manifest(id) => Some(*id),
            _ => None,
        }
    }

    /// Whether an encrypted store keeps this object sealed (docs/FORMAT.md): packs,
    /// manifests, tags, leases, restore profiles and the retention policies (tag names) hold
    /// data or name it; the config, key records, tombstones, the gc lock and probes do not.
    pub fn is_sealed(&self) -> bool {
        matches!(
            self,
            ObjectKey::Pack(_)
                | ObjectKey::Manifest(_)
                | ObjectKey::Tag(_)
                | ObjectKey::Lease(_)
                | ObjectKey::Profile(_)
                | ObjectKey::Policies
        )
    }

    /// The key a tombstone marks, for a tombstone key.
    pub fn tombstoned(&self) -> Option<&ObjectKey> {
        match self {
            ObjectKey::Tombstone(k) => Some(k),
            _ => None,
        }
    }

    /// Parses a key, accepting exactly the shapes the store writes.
    pub fn parse(key: &str) -> Result<ObjectKey, NotAKey> {
        let bad = || NotAKey(key.chars().take(200).collect());
        match key {
            CONFIG => return Ok(ObjectKey::Config),
            GC_LOCK => return Ok(ObjectKey::GcLock),
            RETIRED_KEYS => return Ok(ObjectKey::RetiredKeys),
            POLICIES => return Ok(ObjectKey::Policies),
            _ => {}
        }
        let Some((family, rest)) = key.split_once('/') else { return Err(bad()) };
        let id_in = |suffix: &str| -> Option<ObjectId> {
            let (dir, file) = rest.split_once('/')?;
            // Lowercase only: a key has one spelling, so `packs/ab/AB…` is not `packs/ab/ab…`
            // (found by fuzzing; an object stored under another spelling is foreign).
            let hex = file.strip_suffix(suffix).filter(|h| is_lower_hex(h))?;
            let id = ObjectId::from_hex(hex).ok()?;
            (id.to_hex()[..2] == *dir).then_some(id)
        };
        let parsed = match family {
            "packs" => id_in(".pack").map(ObjectKey::Pack),
            "manifests" => id_in(".manifest").map(ObjectKey::Manifest),
            "profiles" => id_in(".profile").map(ObjectKey::Profile),
            "damage" => id_in(".json").map(ObjectKey::Damage),
            "leases" => rest
                .strip_suffix(".lease")
                .filter(|n| n.len() == 32 && is_lower_hex(n))
                .map(|n| ObjectKey::Lease(n.to_string())),
            "tags" => rest
                .split_once('/')
                .and_then(|(name, file)| Some((name, file.strip_suffix(".tag")?)))
                .and_then(|(name, version)| TagRef::from_parts(name, version).ok())
                .map(ObjectKey::Tag),
            "tombstones" => match ObjectKey::parse(rest) {
                Ok(k @ (ObjectKey::Pack(_) | ObjectKey::Manifest(_))) => Some(k.tombstone()),
                _ => None,
            },
            "keys" => rest
                .strip_suffix(".key")
                .filter(|n| n.len() == 16 && is_lower_hex(n))
                .map(|n| ObjectKey::KeyRecord(n.to_string())),
            "uploads" => UploadKey::parse(rest).map(ObjectKey::Upload),
            "probe" => {
                let ok = !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
                ok.then(|| ObjectKey::Probe(rest.to_string()))
            }
            _ => None,
        };
        parsed.ok_or_else(bad)
    }
}

/// A name in a store that is none of the keys gstore writes (its first 200 characters): a
/// foreign object, or one written under another spelling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a gstore object key: {0:?}")]
pub struct NotAKey(pub String);

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sharded = |f: &mut fmt::Formatter<'_>, family: Family, id: &ObjectId, suffix: &str| {
            let h = id.to_hex();
            write!(f, "{}/{}/{h}.{suffix}", family.prefix(), &h[..2])
        };
        match self {
            ObjectKey::Config => f.write_str(CONFIG),
            ObjectKey::GcLock => f.write_str(GC_LOCK),
            ObjectKey::RetiredKeys => f.write_str(RETIRED_KEYS),
            ObjectKey::Policies => f.write_str(POLICIES),
            ObjectKey::Pack(id) => sharded(f, Family::Packs, id, "pack"),
            ObjectKey::Manifest(id) => sharded(f, Family::Manifests, id, "manifest"),
            ObjectKey::Profile(id) => sharded(f, Family::Profiles, id, "profile"),
            ObjectKey::Damage(id) => sharded(f, Family::Damage, id, "json"),
            ObjectKey::Tag(t) => write!(f, "{}/{}/{}.tag", Family::Tags.prefix(), t.name, t.version),
            ObjectKey::Lease(name) => write!(f, "{}/{name}.lease", Family::Leases.prefix()),
            ObjectKey::Tombstone(k) => write!(f, "{}/{k}", Family::Tombstones.prefix()),
            ObjectKey::Probe(name) => write!(f, "{PROBE}{name}"),
            ObjectKey::KeyRecord(id) => write!(f, "{}/{id}.key", Family::Keys.prefix()),
            ObjectKey::Upload(u) => u.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_layout_is_the_documented_one_and_parses_back() {
        let id = ObjectId::of(b"x");
        let h = id.to_hex();
        let tag = TagRef::parse("app:v1").unwrap();
        let lease = "0a".repeat(16);
        for (key, text) in [
            (ObjectKey::Config, "config.json".to_string()),
            (ObjectKey::GcLock, "gc/lock".to_string()),
            (ObjectKey::RetiredKeys, "keys/retired.json".to_string()),
            (ObjectKey::Policies, "policies.json".to_string()),
            (ObjectKey::Damage(id), format!("damage/{}/{h}.json", &h[..2])),
            (ObjectKey::Pack(id), format!("packs/{}/{h}.pack", &h[..2])),
            (ObjectKey::Manifest(id), format!("manifests/{}/{h}.manifest", &h[..2])),
            (ObjectKey::Profile(id), format!("profiles/{}/{h}.profile", &h[..2])),
            (ObjectKey::Tag(tag), "tags/app/v1.tag".to_string()),
            (ObjectKey::Lease(lease.clone()), format!("leases/{lease}.lease")),
            (ObjectKey::Pack(id).tombstone(), format!("tombstones/packs/{}/{h}.pack", &h[..2])),
            (ObjectKey::Probe("conditional-1a2b".into()), "probe/conditional-1a2b".to_string()),
            (ObjectKey::KeyRecord("0123456789abcdef".into()), "keys/0123456789abcdef.key".to_string()),
            (
                ObjectKey::Upload(UploadKey::Started { owner: 5, id: "ab".repeat(16), repo: "web".into() }),
                format!("uploads/0000000000000005/{}/in.web", "ab".repeat(16)),
            ),
            (
                ObjectKey::Upload(UploadKey::Part { owner: 5, id: "ab".repeat(16), offset: 1 << 25 }),
                format!("uploads/0000000000000005/{}/0000000002000000.part", "ab".repeat(16)),
            ),
            (
                ObjectKey::Upload(UploadKey::Sha256 { owner: 5, id: "ab".repeat(16), end: 7 }),
                format!("uploads/0000000000000005/{}/0000000000000007.sha256", "ab".repeat(16)),
            ),
            (
                ObjectKey::Upload(UploadKey::Staged { owner: 5, digest: h.clone(), id: "ab".repeat(16) }),
                format!("uploads/0000000000000005/staged/{h}/{}", "ab".repeat(16)),
            ),
        ] {
            assert_eq!(key.to_string(), text);
            assert_eq!(ObjectKey::parse(&text), Ok(key));
        }
    }

    #[test]
    fn tricks_and_foreign_keys_are_refused() {
        let id = ObjectId::of(b"x");
        let long = format!("tags/{}/v.tag", "a".repeat(300));
        let wrong_dir =
            format!("packs/{}/{}.pack", if id.to_hex().starts_with("00") { "01" } else { "00" }, id.to_hex());
        // One hex digit in uppercase: the same id, another spelling (found by fuzzing).
        let h = id.to_hex();
        let at = h.find(|c: char| c.is_ascii_alphabetic()).unwrap();
        let upper = format!("manifests/{}/{}{}{}.manifest", &h[..2], &h[..at], h[at..=at].to_uppercase(), &h[at + 1..]);
        for bad in [
            "tags/../x.tag",
            "tags/a/../../etc.tag",
            "tags/a\0b/v.tag",
            "tags/a/b/c.tag",
            "packs/zz/00.pack",
            "index/LOCK",
            "tombstones/tags/a/v.tag",
            "tombstones/config.json",
            "leases/../x.lease",
            "leases/ABC.lease",
            "profiles/zz/00.profile",
            "tombstones/profiles/00/00.profile",
            "probe/../x",
            "probe/",
            "keys/0123.key",
            "keys/0123456789ABCDEF.key",
            "uploads/0000000000000005/../in.web",
            "uploads/5/abababababababababababababababab/in.web",
            "uploads/0000000000000005/abababababababababababababababab/in../x",
            "uploads/0000000000000005/abababababababababababababababab/in.",
            "uploads/0000000000000005/abababababababababababababababab/x/0000000000000000.part",
            "uploads/0000000000000005/staged/00/abababababababababababababababab",
            "../config.json",
            "",
            &long,
            &wrong_dir,
            &upper,
        ] {
            assert!(ObjectKey::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        #[test]
        fn never_panics_and_only_accepts_round_trips(s in ".{0,300}") {
            if let Ok(k) = ObjectKey::parse(&s) {
                prop_assert_eq!(k.to_string(), s);
            }
        }
    }
}
