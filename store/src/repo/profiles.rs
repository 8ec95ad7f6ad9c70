//! Restore profiles in the store (`profiles/<xx>/<manifest id>.profile`): read and replaced
//! beside their images. The layout is `gstore_format::profile`.

use crate::error::Result;
use crate::format::id::ObjectId;
use crate::format::key::ObjectKey;
use crate::format::profile::Profile;
use crate::repo::store::Store;

impl Store {
    /// The restore profile stored for image `id`, if any.
    pub fn profile(&self, id: &ObjectId) -> Result<Option<Profile>> {
        match self.backend().get_opt(&ObjectKey::Profile(*id))? {
            Some(bytes) => Ok(Some(Profile::from_json(&bytes, id)?)),
            None => Ok(None),
        }
    }

    /// Stores `profile` for image `id`, replacing any earlier one.
    pub fn put_profile(&self, id: &ObjectId, profile: &Profile) -> Result<()> {
        self.backend().put(&ObjectKey::Profile(*id), profile.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_store_keeps_one_profile_per_image() {
        let dir = tempfile::tempdir().expect("tempdir");
        let location = crate::StoreLocation::Local(dir.path().to_path_buf());
        Store::init(&location, &crate::StoreConfig::default()).expect("init");
        let store = Store::open(&location).expect("open");
        let id = ObjectId::of(b"image");
        assert_eq!(store.profile(&id).expect("read"), None);
        store.put_profile(&id, &Profile::new(4096, vec![(1, 0)])).expect("put");
        store.put_profile(&id, &Profile::new(4096, vec![(1, 4096)])).expect("replace");
        assert_eq!(store.profile(&id).expect("read"), Some(Profile::new(4096, vec![(1, 4096)])));
        std::fs::write(dir.path().join(ObjectKey::Profile(id).to_string()), b"garbage").expect("damage");
        assert!(store.profile(&id).expect_err("damaged").to_string().contains("corrupt profile"));
    }
}
