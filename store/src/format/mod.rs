//! What the store holds, object by object: the byte layouts of `gstore-format` (docs/FORMAT.md),
//! under the names the store has always given them. Reading and writing them is `repo`'s.

pub use gstore_format::{config, damage, id, key, lease, manifest, meta, now_unix, pack, profile, record, tag};
