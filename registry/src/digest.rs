//! OCI content digests: `sha256:` and 64 lowercase hex digits of the exact bytes served.

use crate::error::{RegistryError, Result};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::io::Write;

/// A `sha256:` digest.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// Parses `sha256:HEX`; other algorithms are refused.
    pub fn parse(s: &str) -> Result<Digest> {
        let hex = s.strip_prefix("sha256:").ok_or_else(|| {
            RegistryError::DigestInvalid(format!("{s:?}: gstore's registry takes sha256 digests only"))
        })?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(RegistryError::DigestInvalid(format!("{s:?} is not sha256: and 64 lowercase hex digits")));
        }
        Ok(Digest { hex: hex.to_string() })
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest { hex: hex::encode(Sha256::digest(bytes)) }
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// A writer that keeps the digest and length of what is written to it.
#[derive(Default)]
pub struct Hashing {
    sha: Sha256,
    len: u64,
}

impl Hashing {
    /// The digest and length of everything written.
    pub fn finish(self) -> (Digest, u64) {
        (Digest { hex: hex::encode(self.sha.finalize()) }, self.len)
    }
}

impl Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.sha.update(buf);
        self.len += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_strictly_and_hash_what_is_written() {
        let d = Digest::of(b"abc");
        assert_eq!(d.to_string(), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(Digest::parse(&d.to_string()).unwrap(), d);
        assert!(Digest::parse("sha512:00").is_err());
        assert!(Digest::parse(&d.to_string().to_uppercase().replace("SHA256", "sha256")).is_err());
        assert!(Digest::parse("sha256:abc").is_err());
        let mut h = Hashing::default();
        h.write_all(b"a").unwrap();
        h.write_all(b"bc").unwrap();
        assert_eq!(h.finish(), (d, 3));
    }
}
