//! `gstore serve` replicated (docs/HTTP.md, "Replicas"): servers over one bucket (s3s-fs on
//! loopback) keep nothing that another needs. A registry upload started on one goes on
//! through a second and ends on a third, also past the second killed in the middle of a
//! request (the parts it stored are kept; the client asks where the upload stands and sends
//! the rest). Behind haproxy (round robin per request) skopeo and podman, clients no one here
//! wrote, push and pull byte for byte while a replica is down and comes back.

use gstore_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
        let log = self.s3.tmp.path().join(format!("{}.log", r.machine));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let listen = format!("127.0.0.1:{}", r.port);
        let child = self
            .s3
            .cmd(&r.machine, &["serve", "--listen", &listen, "--tokens", self.tokens.to_str().unwrap()])
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
        let out = Command::new("curl").args(["-s", "-u", &format!("any:{READ}"), &format!("{}/metrics", self.url(i))]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .filter(|l| l.starts_with("gstore_http_requests_total") && l.contains(&format!("method=\"{method}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// The objects left under `uploads/` in the bucket.
    fn uploads_left(&self) -> usize {
        let dir = self.s3.bucket_dir().join("images/uploads");
        walk(&dir).len()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for i in 0..self.len() {
            self.kill(i);
        }
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] })
        .collect()
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

/// What a request got back: status, headers (lowercase names) and body.
struct Answer {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> String {
        let line = self.headers.lines().find_map(|l| l.strip_prefix(&format!("{name}: ")));
        line.unwrap_or_else(|| panic!("no {name} in {}", self.headers)).trim().to_string()
    }

    fn expect(&self, status: u16) -> &Answer {
        assert_eq!(self.status, status, "{}", String::from_utf8_lossy(&self.body));
        self
    }
}

/// `METHOD URL` with curl, the write token, `headers` and the body in file `body`.
fn curl(method: &str, url: &str, headers: &[&str], body: Option<&Path>) -> Answer {
    curl_with(method, url, headers, body, &[]).wait()
}

/// A curl request running in the background.
struct Pending {
    child: Child,
    dir: tempfile::TempDir,
}

impl Pending {
    fn wait(self) -> Answer {
        let Pending { child, dir } = self;
        let out = child.wait_with_output().unwrap();
        let code = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
        let headers = std::fs::read_to_string(dir.path().join("h")).unwrap_or_default().to_lowercase();
        let body = std::fs::read(dir.path().join("b")).unwrap_or_default();
        Answer { status: code, headers, body }
    }
}

/// As [`curl`], started in the background with `extra` curl arguments.
fn curl_with(method: &str, url: &str, headers: &[&str], body: Option<&Path>, extra: &[&str]) -> Pending {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new("curl");
    c.args(["-s", "-D"]).arg(dir.path().join("h")).arg("-o").arg(dir.path().join("b"));
    c.args(["-w", "%{http_code}", "-X", method, "-u", &format!("any:{WRITE}")]).args(extra);
    for h in headers {
        c.args(["-H", h]);
    }
    if let Some(b) = body {
        c.arg("--data-binary").arg(format!("@{}", b.display()));
    }
    let child = c.arg(url).stdout(Stdio::piped()).spawn().unwrap();
    Pending { child, dir }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// Writes `bytes` to a file in `dir`; returns its path.
fn file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// The range header of a registry upload holding `n` bytes.
fn range_of(n: u64) -> String {
    format!("0-{}", n.saturating_sub(1))
}

#[test]
fn an_upload_goes_on_across_replicas_and_past_one_killed_midway() {
    let fleet = Fleet::start(3);
    let tmp = tempfile::tempdir().unwrap();
    let layer = ustar(&[("data", &random_bytes((48 << 20) - 4096, 1))]);
    let len = layer.len() as u64;
    let config = br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;

    // Started on replica 0; the first 20 MiB through replica 1.
    let start = curl("POST", &format!("{}/v2/web/blobs/uploads/", fleet.url(0)), &[], None);
    let location = start.expect(202).header("location");
    let at = |i: usize| format!("{}{location}", fleet.url(i));
    let first = file(tmp.path(), "first", &layer[..20 << 20]);
    let a = curl("PATCH", &at(1), &[&format!("Content-Range: 0-{}", (20 << 20) - 1)], Some(&first));
    assert_eq!(a.expect(202).header("range"), range_of(20 << 20));

    // The rest through replica 1 again, slowly; replica 1 is killed midway.
    let rest = file(tmp.path(), "rest", &layer[20 << 20..]);
    let range = format!("Content-Range: {}-{}", 20 << 20, len - 1);
    let cut = curl_with("PATCH", &at(1), &[&range], Some(&rest), &["--limit-rate", "8M"]);
    std::thread::sleep(Duration::from_millis(2800));
    fleet.kill(1);
    assert_ne!(cut.wait().status, 202, "the request was cut");

    // Replica 2 says where the upload stands: what replica 1 stored, whole parts only.
    let status = curl("GET", &at(2), &[], None);
    let stood = status.expect(204).header("range");
    let held: u64 = stood.split('-').nth(1).unwrap().parse::<u64>().unwrap() + 1;
    assert!(held >= 20 << 20 && (held - (20 << 20)) % PART == 0 && held < len, "{stood}");
    // A client sending from elsewhere is told so; the rest from where it stands goes on.
    let wrong = file(tmp.path(), "wrong", &layer[..10]);
    curl("PATCH", &at(0), &["Content-Range: 0-9"], Some(&wrong)).expect(416);
    let tail = file(tmp.path(), "tail", &layer[held as usize..]);
    let a = curl("PATCH", &at(2), &[&format!("Content-Range: {held}-{}", len - 1)], Some(&tail));
    assert_eq!(a.expect(202).header("range"), range_of(len));
    // Ended on replica 0, checked against its digest read back from the bucket.
    curl("PUT", &format!("{}?digest={}", at(0), sha256(&layer)), &[], None).expect(201);
    let config_file = file(tmp.path(), "config", config);
    let url = format!("{}/v2/web/blobs/uploads/?digest={}", fleet.url(2), sha256(config));
    curl("POST", &url, &[], Some(&config_file)).expect(201);

    // The manifest through replica 1, restarted: the blobs other replicas took are there.
    fleet.restart(1);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config), "size": config.len() },
        "layers": [{ "mediaType": LAYER, "digest": sha256(&layer), "size": len }],
    }))
    .unwrap();
    let m = file(tmp.path(), "manifest", &manifest);
    let ct = format!("Content-Type: {OCI_MANIFEST}");
    curl("PUT", &format!("{}/v2/web/manifests/1", fleet.url(1)), &[&ct], Some(&m)).expect(201);
    assert_eq!(fleet.uploads_left(), 0, "the uploads a manifest took in are removed");

    // Read back through the others, byte for byte.
    let got = curl("GET", &format!("{}/v2/web/blobs/{}", fleet.url(0), sha256(&layer)), &[], None);
    assert!(got.expect(200).body == layer, "the layer comes back as pushed");
    let got = curl("GET", &format!("{}/v2/web/manifests/1", fleet.url(2)), &[], None);
    assert_eq!(got.expect(200).body, manifest);
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
    let layer_list: Vec<_> =
        gzipped.iter().map(|l| serde_json::json!({ "mediaType": LAYER_GZIP, "digest": put(l), "size": l.len() })).collect();
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

/// `skopeo copy FROM TO` (retrying up to 3 times, as a client does); asserts success.
fn skopeo_copy(from: &str, to: &str) {
    let out = Command::new("skopeo")
        .args(["copy", "--retry-times", "3", "--src-tls-verify=false", "--dest-tls-verify=false"])
        .args(["--src-creds", &format!("any:{READ}"), "--dest-creds", &format!("any:{WRITE}"), from, to])
        .output()
        .expect("skopeo runs (scripts/setup.sh installs it)");
    assert!(out.status.success(), "skopeo copy {from} {to}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The blobs of an OCI layout, by file name.
fn blobs_of(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    walk(&dir.join("blobs/sha256"))
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
    let inspect = Command::new("podman").args(["image", "inspect", "--format", "{{.Digest}}", &image]).output().unwrap();
    let _ = Command::new("podman").args(["rmi", "-f", &image]).output();
    assert_eq!(String::from_utf8_lossy(&inspect.stdout).trim(), digest);
}
