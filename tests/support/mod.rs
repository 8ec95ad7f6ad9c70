//! Helpers for the integration tests: run the real `gstore` binary against a scratch store,
//! make test data, and compare directory trees byte for byte.

mod http;

pub use http::{http, http_start, sha256, ustar, Answer, Pending, Req};
use rand::{Rng, RngCore, SeedableRng};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Path of the `gstore` binary built alongside the tests (target/<profile>/gstore).
pub fn gstore_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>");
    let bin = dir.join("gstore");
    assert!(bin.exists(), "{} not built: run the tests with `cargo nextest run --workspace`", bin.display());
    bin
}

/// The gstore binary with its staging directories (`TMPDIR`) inside the scratch directory
/// `scratch`: a gstore killed mid-restore leaves its image there, removed with the test's.
pub fn gstore_in(scratch: &Path) -> Command {
    let staging = scratch.join("staging");
    std::fs::create_dir_all(&staging).expect("staging directory");
    let mut c = Command::new(gstore_bin());
    c.env("TMPDIR", staging);
    c
}

/// `--criu PATH` for the CRIU (>= 4) that scripts/criu.sh installs at /opt/criu/sbin/criu.
pub fn criu_args() -> Vec<String> {
    let criu = ["/opt/criu/sbin/criu"].into_iter().find(|p| Path::new(p).exists());
    let criu = criu.expect("CRIU >= 4 is not installed at /opt/criu/sbin/criu: run scripts/criu.sh");
    vec!["--criu".into(), criu.into()]
}

/// `args` followed by `criu` ([`criu_args`]).
pub fn with_criu<'a>(args: &[&'a str], criu: &'a [String]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    v.extend(criu.iter().map(String::as_str));
    v
}

/// A scratch directory with a store in it, removed on drop.
pub struct Env {
    /// The scratch directory.
    pub tmp: tempfile::TempDir,
    /// The store path inside it.
    pub store: PathBuf,
}

impl Env {
    /// A scratch directory with an initialized store (extra `init` flags in `init_args`).
    pub fn new(init_args: &[&str]) -> Env {
        let env = Env::uninitialized();
        let mut args = vec!["init"];
        args.extend_from_slice(init_args);
        env.ok(&args);
        env
    }

    /// A scratch directory whose store path does not exist yet.
    pub fn uninitialized() -> Env {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = tmp.path().join("store");
        Env { tmp, store }
    }

    /// A path inside the scratch directory.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// A `gstore` command on this store.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = gstore_in(self.tmp.path());
        c.arg("--store").arg(&self.store).args(args).env_remove("GSTORE_STORE");
        c
    }

    /// Runs `gstore ARGS` and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("gstore runs")
    }

    /// Runs `gstore ARGS`, asserts success, returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "gstore {args:?} failed:\n{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).expect("utf-8 stdout")
    }

    /// Runs `gstore ARGS`, asserts failure, returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            !o.status.success(),
            "gstore {args:?} succeeded but should fail:\n{}",
            String::from_utf8_lossy(&o.stdout)
        );
        String::from_utf8(o.stderr).expect("utf-8 stderr")
    }

    /// Runs `gstore --json ARGS`, asserts success, parses stdout.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.ok(&a)).expect("valid JSON on stdout")
    }

    /// Every pack file in the store.
    pub fn packs(&self) -> Vec<PathBuf> {
        pack_files(&self.store.join("packs"))
    }

    /// Every file below `rel` in the store (none if it does not exist).
    pub fn files_under(&self, rel: &str) -> Vec<PathBuf> {
        files_below(&self.store.join(rel))
    }
}

/// Every `*.pack` file below `dir`, sorted.
pub fn pack_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = files_below(dir);
    out.retain(|p| p.extension().is_some_and(|e| e == "pack"));
    out
}

/// Every file below `dir`, sorted (none if it does not exist).
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk_files(dir, &mut out);
    out.sort();
    out
}

fn walk_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// Seeded random bytes.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Writes a checkpoint-like file: random regions, zero pages and compressible text.
pub fn write_mixed_file(path: &Path, len: usize, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let run = rng.random_range(1..64) * 4096;
        match rng.random_range(0..3) {
            0 => v.extend(std::iter::repeat_n(0u8, run)),
            1 => {
                let line = format!("line {} of a compressible log\n", rng.random::<u32>());
                v.extend(line.bytes().cycle().take(run));
            }
            _ => v.extend(random_bytes(run, rng.random())),
        }
    }
    v.truncate(len);
    fs::write(path, v).expect("write test file");
}

/// Makes a small tree: nested dirs, mixed files, an empty file, a symlink, odd modes.
pub fn make_tree(root: &Path, seed: u64, scale: usize) {
    fs::create_dir_all(root.join("sub/deeper")).unwrap();
    fs::create_dir_all(root.join("empty-dir")).unwrap();
    write_mixed_file(&root.join("pages-1.img"), scale, seed);
    write_mixed_file(&root.join("sub/core.img"), scale / 3 + 17, seed + 1);
    fs::write(root.join("sub/deeper/tiny"), b"x").unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    fs::write(root.join("zeros.bin"), vec![0u8; 300_000]).unwrap();
    std::os::unix::fs::symlink("sub/core.img", root.join("link")).unwrap();
    fs::set_permissions(root.join("sub/deeper/tiny"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(root.join("pages-1.img"), fs::Permissions::from_mode(0o755)).unwrap();
}

/// Asserts two trees hold the same entries, bytes, modes and link targets.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let list = |root: &Path| {
        let mut v = Vec::new();
        list_tree(root, root, &mut v);
        v.sort();
        v
    };
    let (la, lb) = (list(a), list(b));
    assert_eq!(
        la.iter().map(|e| &e.0).collect::<Vec<_>>(),
        lb.iter().map(|e| &e.0).collect::<Vec<_>>(),
        "entry lists differ"
    );
    for ((path, kind_a), (_, kind_b)) in la.iter().zip(&lb) {
        assert_eq!(kind_a, kind_b, "{path}: type or mode differs");
        let (pa, pb) = (a.join(path), b.join(path));
        if fs::symlink_metadata(&pa).unwrap().is_file() {
            assert!(fs::read(&pa).unwrap() == fs::read(&pb).unwrap(), "{path}: contents differ");
        }
    }
}

fn list_tree(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let md = fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
        let desc = if md.file_type().is_symlink() {
            format!("link->{}", fs::read_link(&p).unwrap().display())
        } else {
            format!("{}:{:o}", if md.is_dir() { "dir" } else { "file" }, md.permissions().mode() & 0o7777)
        };
        out.push((rel, desc));
        if md.is_dir() {
            list_tree(root, &p, out);
        }
    }
}

/// A small tmpfs mounted at `dir` for disk-full tests; unmounted on drop.
pub struct SmallDisk {
    /// Mount point.
    pub dir: PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `size` (e.g. "8M") at `dir`.
    pub fn mount(dir: &Path, size: &str) -> SmallDisk {
        fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mounting a tmpfs at {} failed (the disk-full tests need root)", dir.display());
        SmallDisk { dir: dir.to_path_buf() }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// The count file tests/containers/counter.c writes (in a container's bind-mounted state
/// directory): what it counted, waited for, and checked against a checkpoint.
pub struct CountFile {
    path: PathBuf,
    /// The container, for messages.
    name: String,
}

impl CountFile {
    /// The count file at `path` of container `name`.
    pub fn new(path: PathBuf, name: &str) -> CountFile {
        CountFile { path, name: name.to_string() }
    }

    /// The count it wrote last (`None` before the first); a counter that found its memory
    /// wrong fails the test.
    pub fn count(&self) -> Option<u64> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        assert!(!text.starts_with("BAD"), "the counter found its memory wrong: {text}");
        text.trim().parse().ok()
    }

    /// Waits until the count passes `floor`; returns it.
    pub fn wait_above(&self, floor: u64) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(n) = self.count().filter(|&n| n > floor) {
                return n;
            }
            assert!(std::time::Instant::now() < deadline, "{} did not count past {floor}", self.name);
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Waits for the count to pass `at_dump` after a restore begun at `since`, and checks that
    /// it went on from the checkpoint: it counts at most once per 50 ms, so no more than the
    /// time since the restore began allows (however long this thread was kept from looking).
    pub fn counts_on_from(&self, at_dump: u64, since: std::time::Instant) -> u64 {
        let after = self.wait_above(at_dump);
        let reachable = at_dump + 2 + since.elapsed().as_millis() as u64 / 50;
        assert!(after <= reachable, "count jumped from {at_dump} to {after}: not the checkpointed state");
        after
    }

    /// Checks that the count stays put (the container is stopped); returns it.
    pub fn assert_still(&self) -> u64 {
        let at = self.count().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(self.count(), Some(at), "{} counted on while it should be stopped", self.name);
        at
    }
}

/// A CPU process for checkpoint tests: a Python counter holding a seeded blob (24 MiB unless
/// asked otherwise; like
/// a loaded model) that writes its count to a file via rename (so it keeps no growing file
/// open). It runs detached (its own session, parent PID 1), as a service would.
pub struct PyCounter {
    /// Its pid.
    pub pid: u32,
    /// Scratch directory holding the count file.
    pub dir: tempfile::TempDir,
}

/// The counter writes its count in place, fixed width, through one descriptor kept open: a
/// checkpoint that caught it holding a temporary file it was about to rename left an image
/// whose restore could not reopen that file once the running original had renamed it (CRIU:
/// "Can't open file count.tmp on restore").
const COUNTER_PY: &str = r#"
import os, random, sys, time
out = sys.argv[1]
random.seed(int(sys.argv[2]))
blob = random.randbytes(int(sys.argv[3]) << 20)
fd = os.open(out, os.O_RDWR | os.O_CREAT, 0o644)
i = 0
while True:
    i += 1
    os.pwrite(fd, b"%020d" % i, 0)
    time.sleep(0.05)
"#;

/// Starts `python3 SCRIPT ARGS...` (the script written into `dir`) in a session of its own,
/// detached from the test (no terminal, stdio closed, not a child of the test process, as a
/// CRIU-dumpable service would run); returns its pid.
pub fn spawn_detached_python(dir: &Path, script: &str, args: &[&std::ffi::OsStr]) -> u32 {
    let path = dir.join("script.py");
    fs::write(&path, script).unwrap();
    let pidfile = dir.join("pid");
    let st = Command::new("sh")
        .arg("-c")
        .arg(r#"pidfile=$1; shift; setsid python3 "$@" </dev/null >/dev/null 2>&1 & echo $! > "$pidfile""#)
        .arg("sh")
        .arg(&pidfile)
        .arg(&path)
        .args(args)
        .status()
        .unwrap();
    assert!(st.success());
    fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap()
}

impl PyCounter {
    /// Starts a counter whose blob comes from `seed`; waits until it counts.
    pub fn start(seed: u64) -> PyCounter {
        PyCounter::with_blob(seed, 24)
    }

    /// [`PyCounter::start`] with a blob of `mib` MiB.
    pub fn with_blob(seed: u64, mib: u32) -> PyCounter {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("count");
        let (seed, mib) = (seed.to_string(), mib.to_string());
        let pid = spawn_detached_python(dir.path(), COUNTER_PY, &[count.as_os_str(), seed.as_ref(), mib.as_ref()]);
        let c = PyCounter { pid, dir };
        c.wait_above(1);
        c
    }

    /// The last count written, if any.
    pub fn value(&self) -> Option<u64> {
        fs::read_to_string(self.dir.path().join("count")).ok()?.trim().parse().ok()
    }

    /// Waits (up to 10 s) until the count exceeds `floor`; returns it.
    pub fn wait_above(&self, floor: u64) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(v) = self.value().filter(|v| *v > floor) {
                return v;
            }
            assert!(std::time::Instant::now() < deadline, "counter {} stuck at {:?}", self.pid, self.value());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// True while the process is alive (not a zombie).
    pub fn alive(&self) -> bool {
        fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next()))
            .flatten()
            .is_some_and(|state| state != 'Z' && state != 'X')
    }

    /// Waits (up to 5 s) until the pid is free.
    pub fn wait_gone(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while Path::new(&format!("/proc/{}", self.pid)).exists() {
            assert!(std::time::Instant::now() < deadline, "pid {} still taken", self.pid);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Kills the process if it is still this counter.
    pub fn kill(&self) {
        let cmdline = fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&*self.dir.path().to_string_lossy()) {
            let _ = Command::new("kill").arg("-9").arg(self.pid.to_string()).status();
        }
    }
}

impl Drop for PyCounter {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A real S3-compatible server (s3s-fs, installed by scripts/setup.sh) on 127.0.0.1 with
/// fixed credentials and one bucket, stopped on drop. Each "machine" (a separate
/// `XDG_CACHE_HOME`, so a separate local index and cache) runs gstore through [`S3::cmd`].
pub struct S3 {
    /// Scratch directory: server data, machines' caches.
    pub tmp: tempfile::TempDir,
    /// The port it listens on.
    pub port: u16,
    /// The store URL (`s3://gstore-test/images`).
    pub url: String,
    server: Option<std::process::Child>,
}

/// Access key the test server accepts.
pub const S3_KEY: &str = "gstoretestkey";
/// Secret key the test server accepts.
pub const S3_SECRET: &str = "gstoretestsecret0123456789";

/// s3s-fs on PATH, else in cargo's bin directory (`$CARGO_HOME/bin`, `~/.cargo/bin`).
fn s3s_fs_bin() -> PathBuf {
    let path_dirs = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    path_dirs
        .into_iter()
        .chain(cargo_home.map(|c| c.join("bin")))
        .map(|d| d.join("s3s-fs"))
        .find(|p| p.exists())
        .expect("s3s-fs is not installed: run scripts/setup.sh")
}

impl S3 {
    /// Starts a server with an empty bucket `gstore-test`.
    pub fn start() -> S3 {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("data/gstore-test")).unwrap();
        let port = free_port();
        let mut s = S3 { tmp, port, url: "s3://gstore-test/images".into(), server: None };
        s.resume();
        s
    }

    /// (Re)starts the server process and waits until it accepts connections.
    pub fn resume(&mut self) {
        let child = Command::new(s3s_fs_bin())
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--access-key",
                S3_KEY,
                "--secret-key",
                S3_SECRET,
            ])
            .arg(self.tmp.path().join("data"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start s3s-fs");
        self.server = Some(child);
        wait_for_port(self.port, "s3s-fs");
    }

    /// Stops the server (as a crash would: SIGKILL).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Where the server keeps the bucket's objects.
    pub fn bucket_dir(&self) -> PathBuf {
        self.tmp.path().join("data/gstore-test")
    }

    /// `gstore --store s3://… ARGS` as seen from machine `machine`, with `secret` as the secret key.
    pub fn cmd_as(&self, machine: &str, secret: &str, args: &[&str]) -> Command {
        let mut c = gstore_in(self.tmp.path());
        c.arg("--store")
            .arg(&self.url)
            .args(args)
            .env_remove("GSTORE_STORE")
            .env("AWS_ENDPOINT", format!("http://127.0.0.1:{}", self.port))
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", S3_KEY)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .env("AWS_REGION", "us-east-1")
            .env("XDG_CACHE_HOME", self.tmp.path().join(machine));
        c
    }

    /// `gstore --store s3://… ARGS` on machine `machine`.
    pub fn cmd(&self, machine: &str, args: &[&str]) -> Command {
        self.cmd_as(machine, S3_SECRET, args)
    }

    /// Points this process's own AWS_* environment at the server, for library-level tests
    /// (each test runs in its own process under nextest).
    pub fn use_in_process(&self, machine: &str) {
        std::env::set_var("AWS_ENDPOINT", format!("http://127.0.0.1:{}", self.port));
        std::env::set_var("AWS_ALLOW_HTTP", "true");
        std::env::set_var("AWS_ACCESS_KEY_ID", S3_KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", S3_SECRET);
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("XDG_CACHE_HOME", self.tmp.path().join(machine));
    }

    /// Runs on `machine`, asserts success, returns stdout.
    pub fn ok(&self, machine: &str, args: &[&str]) -> String {
        let o = self.cmd(machine, args).output().unwrap();
        assert!(o.status.success(), "gstore {args:?} on {machine} failed:\n{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    }

    /// Runs on `machine`, asserts failure, returns stderr.
    pub fn fails(&self, machine: &str, args: &[&str]) -> String {
        let o = self.cmd(machine, args).output().unwrap();
        assert!(!o.status.success(), "gstore {args:?} on {machine} succeeded but should fail");
        String::from_utf8(o.stderr).unwrap()
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A rate-limited proxy in front of a [`Server`] (see [`Server::slow_link`]).
pub struct SlowLink {
    /// The store URL through the proxy.
    pub url: String,
    _proxy: gstore_faultnet::Proxy,
}

/// A `gstore serve` process in front of a local store, on a free loopback port; killed on drop.
pub struct Server {
    /// The port.
    pub port: u16,
    /// Scratch dir for clients' caches.
    pub tmp: tempfile::TempDir,
    child: std::process::Child,
}

impl Server {
    /// Serves `store` with extra `serve` arguments (e.g. `--tokens FILE`).
    pub fn start(store: &Path, extra: &[&str]) -> Server {
        Server::spawn(Command::new(gstore_bin()), store, extra)
    }

    /// As [`Server::start`], with the server allowed at most `max_fds` open files (sockets
    /// included), as on a machine with a low `ulimit -n`.
    pub fn start_with_fd_limit(store: &Path, extra: &[&str], max_fds: u32) -> Server {
        let mut c = Command::new("sh");
        c.args(["-c", &format!("ulimit -n {max_fds} && exec \"$0\" \"$@\"")]).arg(gstore_bin());
        Server::spawn(c, store, extra)
    }

    /// Runs `command` (gstore, or a shell that execs it) with the `serve` arguments.
    fn spawn(mut command: Command, store: &Path, extra: &[&str]) -> Server {
        let port = free_port();
        let child = command
            .arg("--store")
            .arg(store)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        wait_for_port(port, "gstore serve");
        Server { port, tmp: tempfile::tempdir().unwrap(), child }
    }

    /// Sends SIGTERM and waits for the server to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        self.child.wait().unwrap()
    }

    /// The server's pid (the shell of [`Server::start_with_fd_limit`] execs it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A proxy in front of the server moving `bytes_per_s`: a restore through it is still
    /// midway seconds after it began, on any machine.
    pub fn slow_link(&self, bytes_per_s: u64) -> SlowLink {
        let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let link = gstore_faultnet::Link { rate: Some(bytes_per_s), ..gstore_faultnet::Link::default() };
        let proxy = gstore_faultnet::Proxy::start(upstream, link).unwrap();
        SlowLink { url: format!("http://{}", proxy.addr()), _proxy: proxy }
    }

    /// The store URL clients use.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `gstore --store http://… ARGS` with `token` on machine `machine`.
    pub fn cmd(&self, machine: &str, token: &str, args: &[&str]) -> Command {
        self.cmd_via(&self.url(), machine, token, args)
    }

    /// As [`Server::cmd`], reaching the server at `url` (a proxy in front of it).
    pub fn cmd_via(&self, url: &str, machine: &str, token: &str, args: &[&str]) -> Command {
        let mut c = gstore_in(self.tmp.path());
        c.arg("--store")
            .arg(url)
            .args(args)
            .env("GSTORE_TOKEN", token)
            .env("XDG_CACHE_HOME", self.tmp.path().join(machine));
        c
    }

    /// A raw request with curl: returns (status, body).
    pub fn curl(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[&str],
        body: Option<&Path>,
    ) -> (u16, String) {
        let mut c = Command::new("curl");
        c.args(["-s", "--path-as-is", "-o", "-", "-w", "\n%{http_code}", "-X", method]);
        if let Some(t) = token {
            c.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        for h in headers {
            c.args(["-H", h]);
        }
        if let Some(b) = body {
            c.arg("--data-binary").arg(format!("@{}", b.display()));
        }
        c.arg(format!("{}{path}", self.url()));
        let out = String::from_utf8_lossy(&c.output().expect("curl runs").stdout).to_string();
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A self-signed certificate for 127.0.0.1 and its key (PEM files in `env`'s scratch dir).
pub fn self_signed_cert(env: &Env) -> (PathBuf, PathBuf) {
    let (cert, key) = (env.path("cert.pem"), env.path("key.pem"));
    let st = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .args([
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "extendedKeyUsage=serverAuth",
        ])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(st.success());
    (cert, key)
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Waits (up to 10 s) until something accepts connections on `port`.
pub fn wait_for_port(port: u16, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "{what} did not start on port {port}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A loopback proxy in front of an HTTP server (gstore serve, s3s-fs) that forwards every
/// request and, for the first `lose` requests whose head (request line and headers,
/// lowercased) contains every one of `patterns`, throws the server's answer away and answers
/// 503 instead: the server acted, its answer was lost, as when a connection drops after a
/// write landed. Every request gets its own upstream connection (`Connection: close`).
pub struct LostAnswers {
    /// The port clients connect to.
    pub port: u16,
    /// Answers thrown away so far.
    pub lost: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl LostAnswers {
    /// Starts the proxy in front of `127.0.0.1:upstream` (it runs until the test ends).
    pub fn start(upstream: u16, patterns: &'static [&'static str], lose: usize) -> LostAnswers {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let lost = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = lost.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { continue };
                let counter = counter.clone();
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut byte = [0u8; 4096];
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match client.read(&mut byte) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&byte[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + length {
                        match client.read(&mut byte) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&byte[..n]),
                        }
                    }
                    // Forward with the connection closed after the answer.
                    let original = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let mut forwarded: String = original
                        .split("\r\n")
                        .filter(|l| !l.to_lowercase().starts_with("connection:"))
                        .take_while(|l| !l.is_empty())
                        .map(|l| format!("{l}\r\n"))
                        .collect();
                    forwarded.push_str("Connection: close\r\n\r\n");
                    let Ok(mut server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else { return };
                    let _ = server.write_all(forwarded.as_bytes());
                    let _ = server.write_all(&buf[head_end..head_end + length]);
                    let mut answer = Vec::new();
                    let _ = server.read_to_end(&mut answer);
                    let lose_it =
                        patterns.iter().all(|p| head.contains(p)) && counter.fetch_add(1, Ordering::SeqCst) < lose;
                    if lose_it {
                        let _ = client.write_all(
                            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        );
                    } else {
                        let _ = client.write_all(&answer);
                    }
                });
            }
        });
        LostAnswers { port, lost }
    }
}

/// Damages one stored chunk in the middle of the largest file of image `tag` whose path
/// `wanted` accepts (a byte of its pack flipped); returns the chunk's id.
pub fn damage_a_chunk(env: &Env, tag: &str, wanted: impl Fn(&str) -> bool) -> String {
    use gstore_store::{Store, StoreLocation};
    let store = Store::open_indexed(&StoreLocation::Local(env.store.clone()), &|_| {}).unwrap();
    let m = store.get_manifest(&store.resolve(tag).unwrap()).unwrap();
    let (_, chunks) = m.files().filter(|(e, _)| wanted(&e.path)).max_by_key(|(e, _)| e.size).expect("a wanted file");
    let c = chunks.iter().skip(chunks.len() / 2).find(|c| !c.zero).expect("a stored chunk");
    let loc = store.locate(&c.id).unwrap().expect("indexed");
    let pack = env.packs().into_iter().find(|p| p.to_string_lossy().contains(&loc.pack.to_hex())).expect("its pack");
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes[(loc.offset + loc.stored_len as u64 / 2) as usize] ^= 0x55;
    std::fs::write(&pack, bytes).unwrap();
    c.id.to_hex()
}
