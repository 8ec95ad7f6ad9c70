//! Process checkpoints through the real binary and a real CRIU (>= 4, at /opt/criu/sbin/criu
//! or on PATH; scripts/criu.sh installs it): checkpoint into the store, kill, restore, and the
//! process carries on from where it stopped.

use gstore_tests::*;
use std::fs;

#[test]
fn checkpoint_kill_restore_continues() {
    let env = Env::new(&[]);
    let criu = criu_args();
    let c = PyCounter::start(1);
    let pid = c.pid.to_string();
    let r = env.json(&with_criu(&["checkpoint", "--pid", &pid, "--tag", "counter"], &criu));
    assert_eq!(r["capture"]["image_kind"], "cpu-process");
    let at_dump = c.value().unwrap();
    c.wait_gone(); // CRIU ended it with the dump
    assert_eq!(c.value(), Some(at_dump), "the process counted after its dump");

    let show = env.json(&["show", "counter"]);
    assert_eq!(show["meta"]["kind"], "cpu-process");
    assert!(show["meta"]["capture_timings"]["criu_dump_s"].as_f64().unwrap() > 0.0);

    let restore_started = std::time::Instant::now();
    let r = env.json(&with_criu(&["restore", "counter", "--run"], &criu));
    assert_eq!(r["pid"].as_u64().unwrap(), c.pid as u64, "restored under its own pid");
    let after = c.wait_above(at_dump);
    // From the dump point it counts at most once per 50 ms since the restore began (however
    // long this thread was kept from looking).
    let reachable = at_dump + 2 + restore_started.elapsed().as_millis() as u64 / 50;
    assert!(after <= reachable, "count jumped from {at_dump} to {after}: not the dumped state");
    assert!(c.alive());
}

#[test]
fn a_machine_that_refuses_the_image_runs_nothing_of_it() {
    let env = Env::new(&[]);
    let criu = criu_args();
    let c = PyCounter::start(1);
    let pid = c.pid.to_string();
    env.ok(&with_criu(&["checkpoint", "--pid", &pid, "--tag", "counter"], &criu));
    c.wait_gone();
    let at_dump = c.value().unwrap();
    // A CPU image with a GPU map is refused by the machine check.
    let o = env.run(&with_criu(&["restore", "counter", "--run", "--gpu-map", "0=0"], &criu));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("cannot be restored on this machine") && err.contains("--gpu-map"), "{err}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "a refused restore left pid {pid} behind");
    assert_eq!(c.value(), Some(at_dump), "the refused image counted");
    // Refused is not lost: it restores where the check passes.
    env.ok(&with_criu(&["restore", "counter", "--run"], &criu));
    assert!(c.wait_above(at_dump) > at_dump && c.alive());
}

#[test]
fn leave_running_and_two_runs_share_chunks() {
    let env = Env::new(&[]);
    let criu = criu_args();
    let a = PyCounter::start(7);
    let pid = a.pid.to_string();
    let first = env.json(&with_criu(&["checkpoint", "--pid", &pid, "--tag", "svc:1", "--leave-running"], &criu));
    assert!(first["paused_s"].as_f64().unwrap() > 0.0);
    let v = a.value().unwrap();
    a.wait_above(v + 2); // still counting
                         // A second run of the same program (same blob): its image shares most chunks.
    let b = PyCounter::start(7);
    let pid_b = b.pid.to_string();
    let second = env.json(&with_criu(&["checkpoint", "--pid", &pid_b, "--tag", "svc:2", "--leave-running"], &criu));
    let (logical, added) =
        (second["push"]["logical_bytes"].as_u64().unwrap(), second["push"]["new_plain_bytes"].as_u64().unwrap());
    assert!(logical > 24 << 20, "image of {logical} bytes cannot hold the 24 MiB blob");
    assert!(added * 4 < logical, "second run added {added} of {logical} bytes");
    let du = env.json(&["du"]);
    assert!(du["dedup_ratio"].as_f64().unwrap() > 1.5, "{du}");

    // The leave-running image restores to the dump point once the original is gone.
    a.kill();
    a.wait_gone();
    env.ok(&with_criu(&["restore", "svc:1", "--run"], &criu));
    assert!(a.alive());
    b.kill();
}

#[test]
fn a_failing_criu_leaves_the_process_running_and_stores_nothing() {
    let env = Env::new(&[]);
    let criu = criu_args();
    let c = PyCounter::start(2);
    let pid = c.pid.to_string();
    let err = env.fails(&with_criu(&["checkpoint", "--pid", &pid, "--tag", "x", "--criu-opt=--no-such-option"], &criu));
    assert!(err.contains("criu dump") && err.contains("still running"), "{err}");
    let v = c.value().unwrap();
    c.wait_above(v + 2);
    assert!(env.json(&["ls"]).as_array().unwrap().is_empty());
}

/// A store initialized on a 2 MiB disk (kept mounted while the returned disk lives).
fn store_on_small_disk(env: &Env) -> (SmallDisk, std::path::PathBuf) {
    let disk = SmallDisk::mount(&env.path("disk"), "2M");
    let store = disk.dir.join("store");
    assert!(gstore_at(&store, &["init"]).status.success());
    (disk, store)
}

/// Runs the gstore binary on `store`.
fn gstore_at(store: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(gstore_bin()).arg("--store").arg(store).args(args).output().unwrap()
}

#[test]
fn store_failure_after_the_dump_restores_the_process() {
    let env = Env::uninitialized();
    let criu = criu_args();
    let (_disk, store) = store_on_small_disk(&env);
    let gstore = |args: &[&str]| gstore_at(&store, args);
    let c = PyCounter::start(3);
    let pid = c.pid.to_string();
    let staging = env.path("staging");
    let o =
        gstore(&with_criu(&["checkpoint", "--pid", &pid, "--tag", "x", "--staging", staging.to_str().unwrap()], &criu));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("No space left on device") && err.contains("restored from the staged image"), "{err}");
    let v = c.wait_above(0);
    c.wait_above(v + 2);
    assert!(c.alive());
}

#[test]
fn a_streamed_checkpoint_whose_store_fails_leaves_the_process_running() {
    let env = Env::uninitialized();
    let criu = criu_args();
    let (_disk, store) = store_on_small_disk(&env);
    let gstore = |args: &[&str]| gstore_at(&store, args);
    for leave_running in [false, true] {
        let c = PyCounter::start(3);
        let pid = c.pid.to_string();
        let mut args = vec!["checkpoint", "--pid", &pid, "--tag", "x"];
        if leave_running {
            args.push("--leave-running");
        }
        let o = gstore(&with_criu(&args, &criu));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(err.contains("No space left on device") && err.contains("the process kept running"), "{err}");
        // Running on, not restored: the same pid counts on.
        let v = c.wait_above(0);
        c.wait_above(v + 2);
        assert!(c.alive());
        let ls = gstore(&["ls", "--json"]);
        assert_eq!(String::from_utf8_lossy(&ls.stdout).trim(), "[]", "nothing tagged");
        c.kill();
    }
}

/// Pids of processes whose command line contains `needle`.
fn pids_running(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(needle)
        })
        .collect()
}

#[test]
fn a_checkpoint_whose_gstore_is_killed_loses_neither_the_process_nor_its_image() {
    let env = Env::new(&[]);
    let criu = criu_args();
    // gstore killed once CRIU runs (it streams or is about to), and once CRIU waits at the
    // post-dump gate for the image to be stored (192 MiB of noise take seconds to store here).
    for (i, at) in ["criu", "post-dump.sh"].into_iter().enumerate() {
        let c = PyCounter::with_blob(30 + i as u64, 192);
        let pid = c.pid.to_string();
        let tag = format!("k:{i}");
        let staging = env.path(&format!("tmp-{i}"));
        std::fs::create_dir(&staging).unwrap();
        let mut child = std::process::Command::new(gstore_bin())
            .arg("--store")
            .arg(&env.store)
            .args(with_criu(&["checkpoint", "--pid", &pid, "--tag", &tag], &criu))
            .env("TMPDIR", &staging)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // The staging directory's path is on CRIU's command line and the script's.
        let needle = format!("{}/", staging.display());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !pids_running(&needle).into_iter().any(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(at)
        }) {
            assert!(child.try_wait().unwrap().is_none(), "the checkpoint ended before {at} ran");
            assert!(std::time::Instant::now() < deadline, "{at} never ran");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        // CRIU fails without gstore (or finds the gate unanswered) and resumes the process,
        // which must count on, not stay frozen; nothing is tagged; CRIU and the script end.
        let v = c.wait_above(0);
        c.wait_above(v + 2);
        assert!(c.alive());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !pids_running(&needle).is_empty() {
            assert!(std::time::Instant::now() < deadline, "CRIU or its script still runs after gstore was killed");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let tags = env.json(&["ls"]);
        assert!(tags.as_array().unwrap().iter().all(|t| t["tag"] != tag.as_str()), "{tags}");
        c.kill();
    }
}

#[test]
fn clear_errors_for_dead_pids_and_non_process_images() {
    let env = Env::new(&[]);
    let criu = criu_args();
    let err = env.fails(&with_criu(&["checkpoint", "--pid", "4000000", "--tag", "x"], &criu));
    assert!(err.contains("no process with pid 4000000"), "{err}");
    let f = env.path("file");
    fs::write(&f, b"plain data").unwrap();
    env.ok(&["push", f.to_str().unwrap(), "--tag", "files"]);
    let o = env.run(&with_criu(&["restore", "files", "--run"], &criu));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("is not a process checkpoint"), "{err}");
    let err = env.fails(&["checkpoint", "--pid", "1", "--tag", "x", "--criu", "/nonexistent/criu"]);
    assert!(err.contains("/nonexistent/criu"), "{err}");
}

#[test]
fn a_failed_checkpoint_keeps_criu_s_log_where_it_says() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new(&[]);
    let criu = criu_args();
    // An action script that fails before the dump: CRIU stops after writing its log.
    let script = env.path("fail.sh");
    fs::write(&script, "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = pre-dump ] && exit 1\nexit 0\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let c = PyCounter::start(2);
    let pid = c.pid.to_string();
    let opt = format!("--criu-opt=--action-script={}", script.display());
    let err = env.fails(&with_criu(&["checkpoint", "--pid", &pid, "--tag", "x", &opt], &criu));
    let kept = err.split("is kept at ").nth(1).and_then(|s| s.split(')').next()).unwrap_or_else(|| panic!("{err}"));
    let log = fs::read_to_string(kept.trim()).unwrap_or_else(|e| panic!("{kept}: {e}\n{err}"));
    assert!(log.contains("action"), "{log}");
    let v = c.value().unwrap();
    c.wait_above(v + 2);
}

#[test]
fn a_token_that_may_not_store_the_tag_is_refused_before_the_process_is_touched() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new(&[]);
    let tokens = env.path("tokens");
    let (read, team) = ("readtoken-0123456789", "teamtoken-0123456789");
    fs::write(&tokens, format!("{read} read\n{team} write team-\n")).unwrap();
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    // A CRIU that notes each call before running the real one: no dump may start.
    let calls = env.path("criu-calls");
    let wrapper = env.path("criu");
    let criu = criu_args();
    let real = &criu[1];
    fs::write(&wrapper, format!("#!/bin/sh\necho \"$*\" >> {}\nexec {real} \"$@\"\n", calls.display())).unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    let staging = env.path("staged");
    let c = PyCounter::start(5);
    let pid = c.pid.to_string();
    let cases = [
        (read, vec![], "this token has Read scope; Write is needed"),
        (read, vec!["--staging", staging.to_str().unwrap()], "this token has Read scope; Write is needed"),
        (team, vec![], "this token may only write tags starting with \"team-\""),
    ];
    for (token, extra, why) in cases {
        let mut args = vec!["checkpoint", "--pid", &pid, "--tag", "svc:1", "--criu", wrapper.to_str().unwrap()];
        args.extend(extra);
        let o = server.cmd("m", token, &args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "checkpoint {args:?} with a token that may not write svc succeeded");
        assert!(err.contains("access denied") && err.contains(why), "{args:?}: {err}");
        let criu_ran = fs::read_to_string(&calls).unwrap_or_default();
        assert!(!criu_ran.contains("dump"), "{args:?}: CRIU dumped the process first: {criu_ran}\n{err}");
        // Never stopped nor restored: the same process counts on.
        let v = c.value().unwrap();
        c.wait_above(v + 2);
        assert!(c.alive());
    }
    let ls = server.cmd("m", read, &["ls", "--json"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&ls.stdout).trim(), "[]", "nothing tagged");
}

/// A tree shaped like a tensor-parallel job on the CPU: a parent and two ranks forked from it,
/// joined by loopback TCP connections (NCCL's bootstrap and socket transport) and by a 32 MiB
/// shared-memory segment in /dev/shm that is unlinked once everyone mapped it (NCCL's SHM
/// transport). Each step the ranks write their slot and report over TCP; the parent sums the
/// slots (the "all-reduce"), checks the sum and, every 25 steps, the segment's checksum, and
/// writes `STEP ok` or `STEP bad: WHY`.
const RANKS_PY: &str = r#"
import mmap, os, socket, struct, sys, time, zlib
out, SEG, HEAD = sys.argv[1], 32 << 20, 4096
path = "/dev/shm/gstore-test-ranks-%d" % os.getpid()
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, SEG)
seg = mmap.mmap(fd, SEG)
seg[HEAD:] = bytes(range(256)) * ((SEG - HEAD) // 256)
crc = zlib.crc32(seg[HEAD:])
lst = socket.socket()
lst.bind(("127.0.0.1", 0))
lst.listen(2)
addr = lst.getsockname()
for r in range(2):
    if os.fork() == 0:
        lst.close()
        s = socket.create_connection(addr)
        s.sendall(bytes([r]))
        k = 0
        while True:
            k += 1
            struct.pack_into("<QQ", seg, 16 * r, k, k * (r + 3))
            s.sendall(struct.pack("<Q", k))
            if s.recv(8, socket.MSG_WAITALL) != struct.pack("<Q", k):
                os._exit(3)
conns = {}
for _ in range(2):
    c, _ = lst.accept()
    conns[c.recv(1)[0]] = c
os.unlink(path)
os.close(fd)
status = os.open(out, os.O_RDWR | os.O_CREAT, 0o644)
step, state = 0, "ok"
while state == "ok":
    step += 1
    for r in (0, 1):
        (k,) = struct.unpack("<Q", conns[r].recv(8, socket.MSG_WAITALL))
        if k != step:
            state = "bad: rank %d at step %d, not %d" % (r, k, step)
    total = sum(struct.unpack_from("<QQ", seg, 16 * r)[1] for r in (0, 1))
    if state == "ok" and total != 7 * step:
        state = "bad: all-reduce %d at step %d" % (total, step)
    if state == "ok" and step % 25 == 0 and zlib.crc32(seg[HEAD:]) != crc:
        state = "bad: the shared segment changed at step %d" % step
    os.pwrite(status, b"%020d %-60s" % (step, state.encode()), 0)
    time.sleep(0.01)
    for r in (0, 1):
        conns[r].sendall(struct.pack("<Q", step))
time.sleep(3600)
"#;

/// The tree of [`RANKS_PY`], killed (its whole session) when dropped.
struct Ranks {
    pid: u32,
    dir: tempfile::TempDir,
}

impl Ranks {
    fn start() -> Ranks {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("status");
        let pid = spawn_detached_python(dir.path(), RANKS_PY, &[out.as_os_str()]);
        let ranks = Ranks { pid, dir };
        ranks.wait_past(30);
        ranks
    }

    /// The last step written and its state.
    fn status(&self) -> Option<(u64, String)> {
        let text = fs::read_to_string(self.dir.path().join("status")).ok()?;
        let (step, state) = text.split_once(' ')?;
        Some((step.parse().ok()?, state.trim().to_string()))
    }

    /// Waits (up to 20 s) until a step past `floor` is written; asserts every step was right.
    fn wait_past(&self, floor: u64) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some((step, state)) = self.status() {
                assert_eq!(state, "ok", "step {step}");
                if step > floor {
                    return step;
                }
            }
            assert!(std::time::Instant::now() < deadline, "ranks {} stuck at {:?}", self.pid, self.status());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn processes(&self) -> usize {
        gstore_gpu_dump::procfs::descendants(&[self.pid]).len()
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        let cmdline = fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&*self.dir.path().to_string_lossy()) {
            // Each process by its pid: procps-ng 4.0's kill(1) takes `-9 -PGID` as -1 and
            // kills every process it may.
            for pid in gstore_gpu_dump::procfs::descendants(&[self.pid]) {
                let _ = std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
        }
    }
}

#[test]
fn a_tree_joined_by_tcp_and_a_deleted_shared_segment_restores_and_reduces_on() {
    let env = Env::new(&[]);
    let criu = criu_args();
    let ranks = Ranks::start();
    assert_eq!(ranks.processes(), 3);
    let pid = ranks.pid.to_string();
    // Every connection is between the tree's own processes: gstore dumps them established
    // and records that the restore must restore them so.
    let r = env.json(&with_criu(&["checkpoint", "--pid", &pid, "--tag", "tp:1"], &criu));
    assert_eq!(r["capture"]["image_kind"], "cpu-process");
    assert_eq!(r["capture"]["tcp_connections"], "inside");
    assert_eq!(env.json(&["show", "tp:1"])["meta"]["tcp_connections"], "inside");
    let (at_dump, _) = ranks.status().unwrap();
    let wait = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && std::time::Instant::now() < wait {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(ranks.status().unwrap().0, at_dump, "the tree stepped after its dump");

    env.ok(&with_criu(&["restore", "tp:1", "--run"], &criu));
    assert_eq!(ranks.processes(), 3, "the parent and both ranks are back");
    // 60 steps more: both ranks report over their restored connections, every sum is right
    // and the restored segment is checked twice.
    ranks.wait_past(at_dump + 60);
}

#[test]
fn a_connection_to_the_outside_is_refused_with_the_way_to_ask_and_the_process_runs_on() {
    let env = Env::new(&[]);
    let criu = criu_args();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("count");
    let port = listener.local_addr().unwrap().port().to_string();
    let script = "import os, socket, sys, time\n\
        s = socket.create_connection(('127.0.0.1', int(sys.argv[2])))\n\
        fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n\
        i = 0\n\
        while True:\n    i += 1\n    os.pwrite(fd, b'%020d' % i, 0)\n    time.sleep(0.05)\n";
    let pid = spawn_detached_python(dir.path(), script, &[count.as_os_str(), port.as_ref()]);
    let (_peer, _) = listener.accept().unwrap();
    let value = || fs::read_to_string(&count).ok().and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
    let err = env.fails(&with_criu(&["checkpoint", "--pid", &pid.to_string(), "--tag", "out"], &criu));
    assert!(err.contains("pass --criu-opt=--tcp-established"), "{err}");
    let at = value();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while value() <= at + 2 {
        assert!(std::time::Instant::now() < deadline, "the process stopped counting at {}", value());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status();
}
