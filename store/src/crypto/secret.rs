//! Where the user's key for an encrypted store comes from: a key file (`GSTORE_KEY_FILE`), a
//! passphrase (`GSTORE_PASSPHRASE`, for automation) or a prompt on the terminal. Secrets are
//! wiped from memory when dropped and never printed.

use crate::error::{Result, StoreError};
use std::io::IsTerminal;
use std::path::Path;
use zeroize::Zeroizing;

/// A user key.
pub enum Secret {
    /// 32 random bytes, from a key file holding them as 64 hex digits (`gstore key generate`):
    /// strong enough that no key stretching is needed.
    Key(Zeroizing<[u8; 32]>),
    /// A passphrase (from a prompt, `GSTORE_PASSPHRASE`, or a key file holding anything but
    /// 64 hex digits): stretched with argon2id.
    Passphrase(Zeroizing<String>),
}

impl Secret {
    /// Reads a key file: 64 hex digits are a key, anything else (less one trailing newline)
    /// a passphrase.
    pub fn from_file(path: &Path) -> Result<Secret> {
        let text =
            Zeroizing::new(std::fs::read_to_string(path).map_err(|e| StoreError::io("reading key file", path, e))?);
        Secret::from_text(text.trim_end_matches(['\n', '\r']))
            .ok_or_else(|| StoreError::Path { path: path.to_path_buf(), why: "the key file is empty".into() })
    }

    /// The secret `text` gives: 64 hex digits are a key, anything else a passphrase; `None`
    /// when it is empty.
    fn from_text(text: &str) -> Option<Secret> {
        let mut key = Zeroizing::new([0u8; 32]);
        if text.len() == 64 && hex::decode_to_slice(text, &mut key[..]).is_ok() {
            return Some(Secret::Key(key));
        }
        (!text.is_empty()).then(|| Secret::Passphrase(Zeroizing::new(text.to_string())))
    }

    /// The secret the environment gives: `GSTORE_KEY_FILE`, else `GSTORE_PASSPHRASE`; `None`
    /// when neither is set.
    pub fn from_env() -> Result<Option<Secret>> {
        let env = crate::environment::Keys::read();
        if let Some(p) = env.key_file {
            return Secret::from_file(&p).map(Some);
        }
        Ok(env.passphrase.map(|p| Secret::Passphrase(Zeroizing::new(p))))
    }

    /// Whether the environment names a secret (so the user expects an encrypted store).
    pub fn in_env() -> bool {
        let env = crate::environment::Keys::read();
        env.key_file.is_some() || env.passphrase.is_some()
    }

    /// The secret for the store `store`: from the environment, else asked for on the terminal
    /// when standard input is one, else [`StoreError::KeyRequired`].
    pub fn for_store(store: &str) -> Result<Secret> {
        if let Some(s) = Secret::from_env()? {
            return Ok(s);
        }
        if std::io::stdin().is_terminal() {
            return Secret::prompt(&format!("passphrase or key for {store}: "));
        }
        Err(super::key_required(store))
    }

    /// Asks for a secret on the terminal, without echo: a passphrase, or a key's 64 hex digits.
    pub fn prompt(question: &str) -> Result<Secret> {
        let text = Zeroizing::new(
            rpassword::prompt_password(question)
                .map_err(|e| StoreError::io("reading a passphrase from", "/dev/tty", e))?,
        );
        Secret::from_text(&text).ok_or_else(|| StoreError::Refused("an empty passphrase is not a key".into()))
    }

    /// The text of a new key file: 32 random bytes as 64 hex digits and a newline.
    pub fn new_key_file_text() -> Zeroizing<String> {
        let mut k = Zeroizing::new([0u8; 32]);
        super::random(&mut k[..]);
        Zeroizing::new(format!("{}\n", hex::encode(&k[..])))
    }
}
