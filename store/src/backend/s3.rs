//! S3-compatible buckets: the client's configuration (environment and config file) and
//! one-line hints for the common failures. The objects themselves go through
//! [`super::objects`].

use super::objects::{innermost, ObjectStoreObjects};
use super::Patience;
use crate::environment;
use crate::error::{Result, StoreError};
use std::sync::Arc;

/// The bucket, under `prefix` when it is not empty (see [`super::Backend::s3`]). A request
/// receiving nothing for `patience.stall` is dropped and retried.
pub(super) fn open(bucket: &str, prefix: &str, patience: Patience) -> Result<ObjectStoreObjects> {
    let mut b =
        object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket).with_retry(object_store::RetryConfig {
            max_retries: 3,
            retry_timeout: std::time::Duration::from_secs(15),
            ..Default::default()
        });
    let file = config_file();
    for (key, value) in &file {
        let parsed = key.to_ascii_lowercase().parse().map_err(|_| StoreError::Setting {
            name: "S3 config file".into(),
            why: format!("unknown setting {key}"),
        })?;
        b = b.with_config(parsed, value);
    }
    let setting =
        |k: &str| environment::S3::var(k).or_else(|| file.iter().find(|(f, _)| f == k).map(|(_, v)| v.clone()));
    if setting("AWS_REGION").is_none() && setting("AWS_DEFAULT_REGION").is_none() {
        b = b.with_region("us-east-1");
    }
    // A plain http:// endpoint the client would refuse on every request: a setting to fix,
    // said at once rather than retried as an outage.
    let endpoint = setting("AWS_ENDPOINT").or_else(|| setting("AWS_ENDPOINT_URL"));
    let allow_http = setting("AWS_ALLOW_HTTP").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if let Some(e) = endpoint.filter(|e| e.to_ascii_lowercase().starts_with("http://") && !allow_http) {
        return Err(StoreError::Setting {
            name: format!("S3 endpoint {e}"),
            why: "plain http:// is refused: set AWS_ALLOW_HTTP=true to allow it (or use https://)".into(),
        });
    }
    // object_store's own whole-request limit (30 s) would cut large uploads on slow links;
    // stalls are caught by the read timeout instead.
    use object_store::aws::AmazonS3ConfigKey::Client;
    use object_store::client::ClientConfigKey;
    b = b
        .with_config(Client(ClientConfigKey::ReadTimeout), format!("{}ms", patience.stall.as_millis()))
        .with_config(Client(ClientConfigKey::Timeout), "1h");
    let s3 = b.build().map_err(|e| StoreError::Backend {
        action: "configuring",
        key: format!("s3://{bucket}"),
        message: innermost(&e),
    })?;
    Ok(ObjectStoreObjects::new(if prefix.is_empty() {
        Arc::new(s3)
    } else {
        Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
    }))
}

/// Settings from the S3 config file — `$GSTORE_S3_CONFIG`, else
/// `$XDG_CONFIG_HOME/gstore/s3.env` (else `~/.config/gstore/s3.env`): `AWS_NAME=value` lines,
/// `#` comments. A variable set in the environment wins over the file.
fn config_file() -> Vec<(String, String)> {
    let path = environment::S3::read().config_file;
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else { return Vec::new() };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| k.starts_with("AWS_") && environment::S3::var(k).is_none())
        .collect()
}
