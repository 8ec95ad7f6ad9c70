//! The store's key layout: every object a store holds, as one typed key. Keys are built
//! ([`fmt::Display`]) and parsed ([`ObjectKey::parse`]) here and nowhere else; a parse accepts
//! exactly the shapes the store writes, so a key from a listing or a request cannot name
//! anything outside the store's namespace (no `..`, no NUL, no unknown prefix).

use crate::format::id::ObjectId;
use crate::format::tag::TagRef;
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
    /// in that pack ([`crate::format::damage`]).
    Damage(ObjectId),
    /// `keys/retired.json`: the key records being removed (compare-and-swap writes make two
    /// removals at once see each other, so the last key is never removed).
    RetiredKeys,
    /// `policies.json`: the retention policies `gstore gc` applies by tag name.
    Policies,
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
    pub fn parse(key: &str) -> Result<ObjectKey, String> {
        let bad = || format!("not a gstore object key: {:?}", key.chars().take(200).collect::<String>());
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
            "probe" => {
                let ok = !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
                ok.then(|| ObjectKey::Probe(rest.to_string()))
            }
            _ => None,
        };
        parsed.ok_or_else(bad)
    }
}

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
