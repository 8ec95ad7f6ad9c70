//! `gstore serve` replicated (docs/HTTP.md, "Replicas"): servers over one bucket (s3s-fs on
//! loopback) keep nothing that another needs. A registry upload started on one goes on
//! through a second and ends on a third, also past the second killed in the middle of a
//! request (the parts it stored are kept; the client asks where the upload stands and sends
//! the rest). Behind haproxy (round robin per request) skopeo and podman, clients no one here
//! wrote, push and pull byte for byte while a replica is down and comes back. And a soak:
//! 16 clients at once through haproxy (gstore pushes of process-like images and restores
//! through a caching tier, skopeo pushes and pulls, podman pulls) while a replica is killed
//! and restarted in turn and gc runs in one pass from another machine; no operation fails
//! that its client's retry does not finish, every tag restores exact afterwards, and
//! `verify --read-data` is clean. It runs `GSTORE_REPLICAS_SOAK_SECS` (default 30; the
//! 5-minute run of docs/BENCHMARKS.md by hand).

use gstore_tests::*;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const WRITE: &str = "replicas-write-token-00001";
const READ: &str = "replicas-read-token-000001";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The registry's part size (registry/src/uploads.rs).
const PART: u64 = 16 << 20;

/// One `gstore serve` over the bucket, on a port it keeps across restarts.
struct Replica {
    machine: String,
    port: u16,
    child: Option<Child>,
}

/// A bucket and the replicas serving it, each on a machine of its own (its own index).
struct Fleet {
    s3: S3,
    tokens: PathBuf,
    replicas: Mutex<Vec<Replica>>,
}

impl Fleet {
    /// `n` replicas over a new store.
    fn start(n: usize) -> Fleet {
        let s3 = S3::start();
        s3.ok("admin", &["init"]);
        let tokens = s3.tmp.path().join("tokens");
        std::fs::write(&tokens, format!("{WRITE} write\n{READ} read\n")).unwrap();
        let fleet = Fleet { s3, tokens, replicas: Mutex::new(Vec::new()) };
        for i in 0..n {
            let mut r = Replica { machine: format!("replica-{i}"), port: free_port(), child: None };
            r.child = Some(fleet.launch(&r));
            fleet.replicas.lock().unwrap().push(r);
        }
        fleet
    }

    /// Starts replica `r`'s server and waits for its port; its log goes to `MACHINE.log`.
    fn launch(&self, r: &Replica) -> Child {
        self.launch_with(r, &[])
    }

    /// As [`Fleet::launch`], with `extra` arguments to `serve`.
    fn launch_with(&self, r: &Replica, extra: &[&str]) -> Child {
        let log = self.s3.tmp.path().join(format!("{}.log", r.machine));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let listen = format!("127.0.0.1:{}", r.port);
        let child = self
            .s3
            .cmd(&r.machine, &["serve", "--listen", &listen, "--tokens", self.tokens.to_str().unwrap()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        wait_for_port(r.port, &r.machine);
        child
    }

    /// Kills replica `i` (SIGKILL, as a crash).
    fn kill(&self, i: usize) {
        if let Some(mut c) = self.replicas.lock().unwrap()[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts replica `i` again, on its port.
    fn restart(&self, i: usize) {
        let mut replicas = self.replicas.lock().unwrap();
        let child = self.launch(&replicas[i]);
        replicas[i].child = Some(child);
    }

    /// How many replicas there are (the lock let go at once).
    fn len(&self) -> usize {
        self.replicas.lock().unwrap().len()
    }

    fn port(&self, i: usize) -> u16 {
        self.replicas.lock().unwrap()[i].port
    }

    fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.port(i))
    }

    /// The registry requests replica `i` answered since it last started, by method.
    fn requests(&self, i: usize, method: &str) -> u64 {
        let out = Command::new("curl")
            .args(["-s", "-u", &format!("any:{READ}"), &format!("{}/metrics", self.url(i))])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .filter(|l| l.starts_with("gstore_http_requests_total") && l.contains(&format!("method=\"{method}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// The objects left under `uploads/` in the bucket.
    fn uploads_left(&self) -> usize {
        let dir = self.s3.bucket_dir().join("images/uploads");
        files_below(&dir).len()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// haproxy in front of the fleet: round robin per request, a replica that fails its health
/// check (every 200 ms) taken out, a request refused at connect sent to another.
struct Balancer {
    port: u16,
    child: Child,
}

impl Balancer {
    fn start(fleet: &Fleet, dir: &Path) -> Balancer {
        let port = free_port();
        let servers: String = (0..fleet.len())
            .map(|i| format!("    server r{i} 127.0.0.1:{} check inter 200ms fall 1 rise 1\n", fleet.port(i)))
            .collect();
        let config = format!(
            "global\n    maxconn 1024\ndefaults\n    mode http\n    timeout connect 1s\n    timeout client 300s\n    \
             timeout server 300s\n    retries 3\n    option redispatch 1\nfrontend front\n    bind 127.0.0.1:{port}\n    \
             default_backend replicas\nbackend replicas\n    balance roundrobin\n    option httpchk GET /v1/health\n{servers}"
        );
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, config).unwrap();
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy runs (scripts/setup.sh installs it)");
        wait_for_port(port, "haproxy");
        Balancer { port, child }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `METHOD URL` ([`http`]) with the write token, `headers` and `body`.
fn curl(method: &str, url: &str, headers: &[&str], body: Option<&[u8]>) -> Answer {
    http(method, url, Req { token: Some(WRITE), headers, body, ..Req::default() })
}

/// The range header of a registry upload holding `n` bytes.
fn range_of(n: u64) -> String {
    format!("0-{}", n.saturating_sub(1))
}

#[test]
fn an_upload_goes_on_across_replicas_and_past_one_killed_midway() {
    let fleet = Fleet::start(3);
    let layer = ustar(&[("data", &random_bytes((48 << 20) - 4096, 1))]);
    let len = layer.len() as u64;
    let config = br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;

    // Started on replica 0; the first 20 MiB through replica 1.
    let start = curl("POST", &format!("{}/v2/web/blobs/uploads/", fleet.url(0)), &[], None);
    let location = start.expect(202, None).header("location");
    let at = |i: usize| format!("{}{location}", fleet.url(i));
    let a = curl("PATCH", &at(1), &[&format!("Content-Range: 0-{}", (20 << 20) - 1)], Some(&layer[..20 << 20]));
    assert_eq!(a.expect(202, None).header("range"), range_of(20 << 20));

    // The rest through replica 1 again, slowly; replica 1 is killed midway.
    let range = format!("Content-Range: {}-{}", 20 << 20, len - 1);
    let slowly = Req {
        token: Some(WRITE),
        headers: &[&range],
        body: Some(&layer[20 << 20..]),
        extra: &["--limit-rate", "8M"],
        ..Req::default()
    };
    let cut = http_start("PATCH", &at(1), slowly);
    std::thread::sleep(Duration::from_millis(2800));
    fleet.kill(1);
    assert_ne!(cut.wait().status, 202, "the request was cut");

    // Replica 2 says where the upload stands: what replica 1 stored, whole parts only.
    let status = curl("GET", &at(2), &[], None);
    let stood = status.expect(204, None).header("range");
    let held: u64 = stood.split('-').nth(1).unwrap().parse::<u64>().unwrap() + 1;
    assert!(held >= 20 << 20 && (held - (20 << 20)).is_multiple_of(PART) && held < len, "{stood}");
    // A client sending from elsewhere is told so; the rest from where it stands goes on.
    curl("PATCH", &at(0), &["Content-Range: 0-9"], Some(&layer[..10])).expect(416, None);
    let a = curl("PATCH", &at(2), &[&format!("Content-Range: {held}-{}", len - 1)], Some(&layer[held as usize..]));
    assert_eq!(a.expect(202, None).header("range"), range_of(len));
    // Ended on replica 0, checked against its digest read back from the bucket.
    curl("PUT", &format!("{}?digest={}", at(0), sha256(&layer)), &[], None).expect(201, None);
    let url = format!("{}/v2/web/blobs/uploads/?digest={}", fleet.url(2), sha256(config));
    curl("POST", &url, &[], Some(config)).expect(201, None);

    // The manifest through replica 1, restarted: the blobs other replicas took are there.
    fleet.restart(1);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config), "size": config.len() },
        "layers": [{ "mediaType": LAYER, "digest": sha256(&layer), "size": len }],
    }))
    .unwrap();
    let ct = format!("Content-Type: {OCI_MANIFEST}");
    curl("PUT", &format!("{}/v2/web/manifests/1", fleet.url(1)), &[&ct], Some(&manifest)).expect(201, None);
    assert_eq!(fleet.uploads_left(), 0, "the uploads a manifest took in are removed");

    // Read back through the others, byte for byte.
    let got = curl("GET", &format!("{}/v2/web/blobs/{}", fleet.url(0), sha256(&layer)), &[], None);
    assert!(got.expect(200, None).body == layer, "the layer comes back as pushed");
    let got = curl("GET", &format!("{}/v2/web/manifests/1", fleet.url(2)), &[], None);
    assert_eq!(got.expect(200, None).body, manifest);
}

/// Pushes an image of `config` and `layer` as `repo:tag` through the registry at `url`, in
/// one request per blob; returns the manifest.
fn push_image(url: &str, repo: &str, tag: &str, config: &[u8], layer: &[u8]) -> Vec<u8> {
    for blob in [config, layer] {
        curl("POST", &format!("{url}/v2/{repo}/blobs/uploads/?digest={}", sha256(blob)), &[], Some(blob))
            .expect(201, None);
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config), "size": config.len() },
        "layers": [{ "mediaType": LAYER, "digest": sha256(layer), "size": layer.len() }],
    }))
    .unwrap();
    let ct = format!("Content-Type: {OCI_MANIFEST}");
    curl("PUT", &format!("{url}/v2/{repo}/manifests/{tag}"), &[&ct], Some(&manifest)).expect(201, None);
    manifest
}

#[test]
fn a_busy_replica_serves_what_another_pushed_since_it_last_read_the_store() {
    let fleet = Fleet::start(2);
    let config = br#"{"architecture":"amd64","os":"linux"}"#;
    let big = ustar(&[("big", &random_bytes(24 << 20, 1))]);
    push_image(&fleet.url(0), "web", "1", config, &big);
    // Replica 1 busy: a slow pull keeps its store (and index) open, as under steady load.
    let slowly = Req { token: Some(WRITE), extra: &["--limit-rate", "2M"], ..Req::default() };
    let slow = http_start("GET", &format!("{}/v2/web/blobs/{}", fleet.url(1), sha256(&big)), slowly);
    std::thread::sleep(Duration::from_millis(1500));
    // A new image through replica 0; then through replica 1, still busy.
    let layer = ustar(&[("new", &random_bytes(3 << 20, 2))]);
    let manifest = push_image(&fleet.url(0), "web", "2", config, &layer);
    let got = curl("GET", &format!("{}/v2/web/manifests/2", fleet.url(1)), &[], None);
    assert_eq!(got.expect(200, None).body, manifest);
    let got = curl("GET", &format!("{}/v2/web/blobs/{}", fleet.url(1), sha256(&layer)), &[], None);
    assert!(got.expect(200, None).body == layer, "the new layer comes back as pushed");
    let pulled = slow.wait();
    assert!(pulled.expect(200, None).body == big, "the slow pull went on meanwhile");
}

/// An OCI image layout in `dir` of `layers` (plain tars, stored gzipped as registries keep
/// them: a client pushing a plain layer compresses it) tagged `1`; returns the manifest's
/// digest.
fn oci_layout(dir: &Path, layers: &[Vec<u8>]) -> String {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = sha256(bytes);
        std::fs::write(blobs.join(d.strip_prefix("sha256:").unwrap()), bytes).unwrap();
        d
    };
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
    let gzipped: Vec<Vec<u8>> = layers
        .iter()
        .map(|l| {
            let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut z, l).unwrap();
            z.finish().unwrap()
        })
        .collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    }))
    .unwrap();
    let layer_list: Vec<_> = gzipped
        .iter()
        .map(|l| serde_json::json!({ "mediaType": LAYER_GZIP, "digest": put(l), "size": l.len() }))
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(&config), "size": config.len() },
        "layers": layer_list,
    }))
    .unwrap();
    let digest = put(&manifest);
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": [{
        "mediaType": OCI_MANIFEST, "digest": digest, "size": manifest.len(),
        "annotations": { "org.opencontainers.image.ref.name": "1" } }] });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    digest
}

/// `skopeo copy FROM TO`; asserts success.
fn skopeo_copy(from: &str, to: &str) {
    skopeo(from, to).unwrap_or_else(|e| panic!("skopeo copy {from} {to}: {e}"));
}

/// The blobs of an OCI layout, by file name.
fn blobs_of(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    files_below(&dir.join("blobs/sha256"))
        .into_iter()
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

#[test]
fn behind_haproxy_skopeo_and_podman_push_and_pull_byte_for_byte_while_a_replica_is_down() {
    let fleet = Fleet::start(3);
    let tmp = tempfile::tempdir().unwrap();
    let balancer = Balancer::start(&fleet, tmp.path());
    let host = balancer.host();
    let layers: Vec<Vec<u8>> = [(6, 1), (12, 2), (3, 3)]
        .iter()
        .map(|&(mib, seed)| ustar(&[(&format!("layer-{seed}"), &random_bytes(mib << 20, seed))]))
        .collect();
    let src = tmp.path().join("src");
    let digest = oci_layout(&src, &layers);

    // A push's requests land on every replica.
    skopeo_copy(&format!("oci:{}:1", src.display()), &format!("docker://{host}/web:1"));
    for i in 0..3 {
        let writes = fleet.requests(i, "POST") + fleet.requests(i, "PATCH") + fleet.requests(i, "PUT");
        assert!(writes > 0, "replica {i} took none of the push's writes");
    }
    let back = tmp.path().join("back");
    skopeo_copy(&format!("docker://{host}/web:1"), &format!("oci:{}:1", back.display()));
    let (got, sent) = (blobs_of(&back), blobs_of(&src));
    assert!(got == sent, "every blob comes back as pushed: {:?} vs {:?}", got.keys(), sent.keys());

    // One replica down: pushes and pulls go on through the others.
    fleet.kill(1);
    skopeo_copy(&format!("oci:{}:1", src.display()), &format!("docker://{host}/web:2"));
    let back2 = tmp.path().join("back2");
    skopeo_copy(&format!("docker://{host}/web:2"), &format!("oci:{}:1", back2.display()));
    assert!(blobs_of(&back2) == blobs_of(&src));
    fleet.restart(1);
    assert_eq!(fleet.uploads_left(), 0, "every upload was taken in");

    // podman pulls it, its digest as pushed.
    let image = format!("{host}/web:1");
    let pull = Command::new("podman")
        .args(["pull", "--tls-verify=false", "--creds", &format!("any:{READ}"), &image])
        .output()
        .expect("podman runs");
    assert!(pull.status.success(), "podman pull: {}", String::from_utf8_lossy(&pull.stderr));
    let inspect =
        Command::new("podman").args(["image", "inspect", "--format", "{{.Digest}}", &image]).output().unwrap();
    let _ = Command::new("podman").args(["rmi", "-f", &image]).output();
    assert_eq!(String::from_utf8_lossy(&inspect.stdout).trim(), digest);
}

/// What the soak's clients share.
struct Soak {
    fleet: Fleet,
    /// The balancer's `HOST:PORT`.
    host: String,
    /// A caching tier over the bucket, which the restores read through.
    tier: String,
    scratch: PathBuf,
    stop: AtomicBool,
    /// Operations done, and those done only after the client tried again.
    done: AtomicUsize,
    retried: AtomicUsize,
    kills: AtomicUsize,
    /// What each gc run did.
    gc_runs: Mutex<Vec<String>>,
    /// Operations that failed however often they were tried.
    failed: Mutex<Vec<String>>,
    /// Operations that failed and then succeeded when tried again, by kind: how many, and
    /// the first error.
    recovered: Mutex<BTreeMap<String, (usize, String)>>,
    /// Tags pushed and kept, with their sources: gstore images, and registry images.
    images: Mutex<BTreeMap<String, PathBuf>>,
    layouts: Mutex<BTreeMap<String, PathBuf>>,
}

/// How long the soak runs: `GSTORE_REPLICAS_SOAK_SECS` (default 30; 300 by hand,
/// docs/BENCHMARKS.md).
fn soak_secs() -> u64 {
    std::env::var("GSTORE_REPLICAS_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30)
}

impl Soak {
    /// Runs `op` until it succeeds, 4 tries at most, a second apart, as a client retries.
    fn attempt(&self, what: &str, mut op: impl FnMut() -> Result<(), String>) -> bool {
        let mut errors: Vec<String> = Vec::new();
        for _ in 0..4 {
            match op() {
                Ok(()) => {
                    self.done.fetch_add(1, Ordering::Relaxed);
                    if let Some(first) = errors.first() {
                        self.retried.fetch_add(1, Ordering::Relaxed);
                        let kind = what.split(' ').next().unwrap_or(what).to_string();
                        let mut recovered = self.recovered.lock().unwrap();
                        let entry = recovered.entry(kind).or_insert_with(|| (0, first.clone()));
                        entry.0 += 1;
                    }
                    return true;
                }
                Err(e) => errors.push(e),
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        self.failed.lock().unwrap().push(format!("{what}: {errors:?}"));
        false
    }

    /// `gstore ARGS` through the balancer as client `who`, restores reading through the tier.
    fn gstore(&self, who: &str, args: &[&str]) -> Result<(), String> {
        let mut c = gstore_in(&self.scratch);
        c.arg("--store")
            .arg(format!("http://{}", self.host))
            .args(args)
            .env("GSTORE_TOKEN", WRITE)
            .env("GSTORE_TIERS", &self.tier)
            .env("XDG_CACHE_HOME", self.scratch.join(who));
        ran(c)
    }

    /// Pushes process-like images (memory changed page by page from one to the next),
    /// restores each through the tier and compares it, and removes the one before last.
    fn pusher(&self, n: u64) {
        let mut pages = random_bytes(6 << 20, 100 + n);
        let mut rng = rand::rngs::StdRng::seed_from_u64(n);
        for v in 0.. {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            for _ in 0..64 {
                let page = rng.random_range(0..pages.len() / 4096) * 4096;
                rng.fill_bytes(&mut pages[page..page + 4096]);
            }
            let src = self.scratch.join(format!("src-p{n}-{v}"));
            std::fs::create_dir_all(&src).unwrap();
            std::fs::write(src.join("pages-1.img"), &pages).unwrap();
            std::fs::write(src.join("core.img"), format!("process {n} at {v}")).unwrap();
            // What this version alone holds: removed with its tag, so gc has packs to reclaim.
            std::fs::write(src.join("scratch.img"), random_bytes(1 << 20, 10_000 * n + v)).unwrap();
            let (who, tag) = (format!("p{n}"), format!("soak-p{n}:v{v}"));
            if !self
                .attempt(&format!("push {tag}"), || self.gstore(&who, &["push", src.to_str().unwrap(), "--tag", &tag]))
            {
                continue;
            }
            self.images.lock().unwrap().insert(tag.clone(), src.clone());
            let out = self.scratch.join(format!("out-p{n}-{v}"));
            self.attempt(&format!("restore {tag}"), || {
                let _ = std::fs::remove_dir_all(&out);
                self.gstore(&who, &["restore", &tag, "--to", out.to_str().unwrap()])?;
                same_tree(&src, &out)
            });
            let _ = std::fs::remove_dir_all(&out);
            if v >= 2 {
                let old = format!("soak-p{n}:v{}", v - 2);
                if self.attempt(&format!("rm {old}"), || self.gstore(&who, &["rm", &old])) {
                    self.images.lock().unwrap().remove(&old);
                }
            }
        }
    }

    /// Pushes registry images with skopeo and pulls each back, comparing every blob.
    fn registry_client(&self, n: u64) {
        for v in 0.. {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let src = self.scratch.join(format!("oci-r{n}-{v}"));
            let layers = [
                ustar(&[("base", &random_bytes(2 << 20, 200 + n))]),
                ustar(&[("top", &random_bytes(1 << 20, 1000 * n + v))]),
            ];
            oci_layout(&src, &layers);
            let image = format!("docker://{}/reg{n}:{v}", self.host);
            let from = format!("oci:{}:1", src.display());
            if !self.attempt(&format!("skopeo push {image}"), || skopeo(&from, &image)) {
                continue;
            }
            self.layouts.lock().unwrap().insert(image.clone(), src.clone());
            let back = self.scratch.join(format!("back-r{n}-{v}"));
            self.attempt(&format!("skopeo pull {image}"), || {
                let _ = std::fs::remove_dir_all(&back);
                skopeo(&image, &format!("oci:{}:1", back.display()))?;
                if blobs_of(&back) == blobs_of(&src) {
                    Ok(())
                } else {
                    Err("blobs differ".into())
                }
            });
            let _ = std::fs::remove_dir_all(&back);
        }
    }

    /// Pulls one of registry client `n`'s images with podman (the last by name), checking its
    /// digest.
    fn podman_client(&self, n: u64) {
        while !self.stop.load(Ordering::Relaxed) {
            let newest = self
                .layouts
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find(|(k, _)| k.contains(&format!("/reg{n}:")))
                .map(|(k, p)| (k.clone(), p.clone()));
            let Some((image, src)) = newest else {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            };
            let name = image.trim_start_matches("docker://").to_string();
            let index: serde_json::Value =
                serde_json::from_slice(&std::fs::read(src.join("index.json")).unwrap()).unwrap();
            let want = index["manifests"][0]["digest"].as_str().unwrap().to_string();
            self.attempt(&format!("podman pull {name}"), || {
                let mut pull = Command::new("podman");
                pull.args(["pull", "-q", "--tls-verify=false", "--creds", &format!("any:{READ}"), &name]);
                ran(pull)?;
                let got = Command::new("podman")
                    .args(["image", "inspect", "--format", "{{.Digest}}", &name])
                    .output()
                    .unwrap();
                let _ = Command::new("podman").args(["rmi", "-f", &name]).output();
                let got = String::from_utf8_lossy(&got.stdout).trim().to_string();
                if got == want {
                    Ok(())
                } else {
                    Err(format!("digest {got}, pushed {want}"))
                }
            });
        }
    }

    /// Kills a replica every `every` and starts it again a second later, in turn.
    fn killer(&self, every: Duration) {
        let mut i = 0;
        while sleep_unless_stopped(&self.stop, every) {
            fleet_kill_and_restart(&self.fleet, i % self.fleet.len());
            self.kills.fetch_add(1, Ordering::Relaxed);
            i += 1;
        }
    }

    /// Runs gc (one run) on the bucket every `every`, from a machine of its own.
    /// A run starts `every` after the last one started (at once when that one took longer).
    /// Each run's seconds, passes and bytes reclaimed are kept for the report.
    fn collector(&self, every: Duration) {
        let mut last = std::time::Instant::now();
        while sleep_unless_stopped(&self.stop, every.saturating_sub(last.elapsed())) {
            let started = std::time::Instant::now();
            last = started;
            self.attempt("gc", || {
                let out = self.fleet.s3.cmd("gc", &["gc", "--json"]).output().unwrap();
                if !out.status.success() {
                    return Err(String::from_utf8_lossy(&out.stderr).into_owned());
                }
                let r: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
                let line = format!(
                    "{:.1} s, {} passes, {} bytes reclaimed",
                    started.elapsed().as_secs_f64(),
                    r["passes"],
                    r["bytes_reclaimed"]
                );
                self.gc_runs.lock().unwrap().push(line);
                Ok(())
            });
        }
    }
}

/// Sleeps `d`, waking early when `stop` is set; whether it was not.
fn sleep_unless_stopped(stop: &AtomicBool, d: Duration) -> bool {
    let until = std::time::Instant::now() + d;
    while std::time::Instant::now() < until {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    !stop.load(Ordering::Relaxed)
}

fn fleet_kill_and_restart(fleet: &Fleet, i: usize) {
    fleet.kill(i);
    std::thread::sleep(Duration::from_secs(1));
    fleet.restart(i);
}

/// `skopeo copy FROM TO` once; its error.
fn skopeo(from: &str, to: &str) -> Result<(), String> {
    let mut c = Command::new("skopeo");
    c.args(["copy", "-q", "--src-tls-verify=false", "--dest-tls-verify=false"]).args([
        "--src-creds",
        &format!("any:{READ}"),
        "--dest-creds",
        &format!("any:{WRITE}"),
        from,
        to,
    ]);
    ran(c)
}

/// Runs `c`; its standard error when it fails.
fn ran(mut c: Command) -> Result<(), String> {
    let out = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Whether the regular files of two trees hold the same bytes.
fn same_tree(a: &Path, b: &Path) -> Result<(), String> {
    let (fa, fb) = (files_below(a), files_below(b));
    let rel =
        |root: &Path, v: &[PathBuf]| v.iter().map(|p| p.strip_prefix(root).unwrap().to_path_buf()).collect::<Vec<_>>();
    if rel(a, &fa) != rel(b, &fb) {
        return Err(format!("{} and {} hold other files", a.display(), b.display()));
    }
    for (x, y) in fa.iter().zip(&fb) {
        if std::fs::read(x).unwrap() != std::fs::read(y).unwrap() {
            return Err(format!("{} differs", y.display()));
        }
    }
    Ok(())
}

#[test]
fn sixteen_clients_through_haproxy_ride_out_replica_kills_and_gc() {
    let secs = soak_secs();
    let fleet = Fleet::start(3);
    let scratch = fleet.s3.tmp.path().join("soak");
    std::fs::create_dir_all(&scratch).unwrap();
    let balancer = Balancer::start(&fleet, &scratch);
    let mut tier = Replica { machine: "tier".into(), port: free_port(), child: None };
    let cache = scratch.join("tier-cache");
    tier.child = Some(fleet.launch_with(&tier, &["--cache", cache.to_str().unwrap()]));
    let soak = Soak {
        host: balancer.host(),
        tier: format!("http://127.0.0.1:{}", tier.port),
        fleet,
        scratch,
        stop: AtomicBool::new(false),
        done: AtomicUsize::new(0),
        retried: AtomicUsize::new(0),
        kills: AtomicUsize::new(0),
        gc_runs: Mutex::new(Vec::new()),
        failed: Mutex::new(Vec::new()),
        recovered: Mutex::new(BTreeMap::new()),
        images: Mutex::new(BTreeMap::new()),
        layouts: Mutex::new(BTreeMap::new()),
    };
    // A kill every 30 s and gc every minute over 5 minutes; shorter runs keep the ratios.
    let (kill_every, gc_every) =
        (Duration::from_secs((secs / 10).clamp(5, 30)), Duration::from_secs((secs / 5).clamp(10, 60)));
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        for n in 0..8 {
            let soak = &soak;
            s.spawn(move || soak.pusher(n));
        }
        for n in 0..6 {
            let soak = &soak;
            s.spawn(move || soak.registry_client(n));
        }
        for n in 0..2 {
            let soak = &soak;
            s.spawn(move || soak.podman_client(n));
        }
        s.spawn(|| soak.killer(kill_every));
        s.spawn(|| soak.collector(gc_every));
        std::thread::sleep(Duration::from_secs(secs));
        soak.stop.store(true, Ordering::Relaxed);
    });
    let ran = started.elapsed();
    let failed = soak.failed.lock().unwrap().clone();
    assert!(failed.is_empty(), "operations that failed however often they were tried: {failed:#?}");

    // Every tag kept restores exact, through the balancer; every registry image pulls back.
    let images = soak.images.lock().unwrap().clone();
    for (tag, src) in &images {
        let out = soak.scratch.join("final").join(tag.replace(':', "-"));
        soak.gstore("final", &["restore", tag, "--to", out.to_str().unwrap()]).unwrap();
        same_tree(src, &out).unwrap();
    }
    let layouts = soak.layouts.lock().unwrap().clone();
    for (i, (image, src)) in layouts.iter().enumerate() {
        let back = soak.scratch.join(format!("final-oci-{i}"));
        skopeo(image, &format!("oci:{}:1", back.display())).unwrap();
        assert!(blobs_of(&back) == blobs_of(src), "{image} comes back as pushed");
    }
    soak.fleet.s3.ok("admin", &["verify", "--read-data"]);
    eprintln!(
        "soak: {:.0} s, 16 clients, {} operations ({} only after a retry, 0 failed), {} replica kills, {} gc runs; \
         {} gstore tags and {} registry images checked after",
        ran.as_secs_f64(),
        soak.done.load(Ordering::Relaxed),
        soak.retried.load(Ordering::Relaxed),
        soak.kills.load(Ordering::Relaxed),
        soak.gc_runs.lock().unwrap().len(),
        images.len(),
        layouts.len()
    );
    for run in soak.gc_runs.lock().unwrap().iter() {
        eprintln!("soak: gc {run}");
    }
    for (kind, (n, first)) in soak.recovered.lock().unwrap().iter() {
        eprintln!("soak: {n} {kind} retried, the first error: {}", first.lines().last().unwrap_or_default());
    }
    drop(tier);
}
