//! Checkpoint and restore of a real CPU process with the real CRIU (root, CRIU >= 4.0 at
//! /opt/criu/sbin/criu: scripts/criu.sh installs it). Without CRIU these tests fail.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{criu, parent_of, wait_for, Counter};
use gstore_gpu_dump::checkpoint::{self, CheckpointOptions, ImageKind, RestoreOptions};
use gstore_gpu_dump::{procfs, GpuDumpError, Phase};

#[test]
fn dump_kills_then_restore_continues_under_the_same_pid() {
    let criu = criu();
    let counter = Counter::start();
    let dir = counter.image_dir("img");
    let report = checkpoint::checkpoint(counter.pid, &dir, &CheckpointOptions::new(&criu)).expect("checkpoint");
    assert_eq!(report.image_kind, ImageKind::CpuProcess);
    assert_eq!(report.pid, counter.pid);
    assert_eq!(report.criu_version, criu.version(), "the binary's own version");
    assert!(report.timings.lock_s.is_none() && report.timings.gpu_checkpoint_s.is_none());
    assert!(report.timings.criu_dump_s > 0.0);
    assert!(dir.join("pstree.img").exists() && dir.join("dump.log").exists());
    eprintln!("capture: {}", serde_json::to_string(&report).expect("json"));

    // The dump killed it: it stops counting (and is a zombie until PID 1 reaps it).
    assert!(wait_for(Duration::from_secs(2), || (!procfs::is_alive(counter.pid)).then_some(())).is_some());
    let at_dump = counter.value();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(counter.value(), at_dump, "the process kept counting after the dump");

    let opts = RestoreOptions { original_pid: Some(counter.pid), ..RestoreOptions::new(&criu) };
    let restored = checkpoint::restore(&dir, &opts).expect("restore");
    assert_eq!(restored.pid, counter.pid, "CRIU restores the original pid");
    let first = counter.value();
    assert!(first >= at_dump, "restored counter went back: {first} < {at_dump}");
    let later = counter.wait_above(first + 3, Duration::from_secs(5));
    assert!(later <= at_dump + 200, "counter jumped from {at_dump} to {later}: not a continuation");
    assert_ne!(parent_of(restored.pid), std::process::id(), "restore is detached from us");
    eprintln!("restore: {}", serde_json::to_string(&restored).expect("json"));
}

#[test]
fn leave_running_keeps_counting_and_the_image_restores_the_dump_point() {
    let criu = criu();
    let counter = Counter::start();
    let dir = counter.image_dir("img");
    let opts = CheckpointOptions { leave_running: true, ..CheckpointOptions::new(&criu) };
    // The dumped count lies between these two reads: the process counts on during the dump.
    let before_dump = counter.value();
    let report = checkpoint::checkpoint(counter.pid, &dir, &opts).expect("checkpoint");
    assert!(report.leave_running && report.timings.gpu_resume_s.is_none());
    let at_dump = counter.value();
    assert!(procfs::is_alive(counter.pid), "--leave-running kept the process");
    let went_on = counter.wait_above(at_dump + 20, Duration::from_secs(10));

    // Kill it and bring back the dumped state: it counts on from the dump point, not from
    // where the killed process stopped. Where it stopped is read once it is dead and before
    // the restore: the restored process may write its next count at once.
    counter.kill();
    wait_for(Duration::from_secs(5), || (!procfs::is_alive(counter.pid)).then_some(())).expect("killed");
    let stopped_at = counter.value();
    assert!(stopped_at >= went_on);
    let opts = RestoreOptions { original_pid: Some(counter.pid), ..RestoreOptions::new(&criu) };
    let restore_started = std::time::Instant::now();
    let restored = checkpoint::restore(&dir, &opts).expect("restore");
    assert_eq!(restored.pid, counter.pid);
    let resumed = wait_for(Duration::from_secs(5), || Some(counter.value()).filter(|v| *v != stopped_at))
        .expect("the restored process counts");
    // From the dump point it counts at most once per 50 ms since the restore began (however
    // long this thread was kept from looking).
    let reachable = at_dump + 2 + restore_started.elapsed().as_millis() as u64 / 50;
    assert!(
        resumed > before_dump && resumed <= reachable,
        "restored counter at {resumed}; dump was at {at_dump}, the killed process got to {stopped_at}"
    );
    counter.wait_above(resumed + 3, Duration::from_secs(5));
    eprintln!("restore after kill: {}", serde_json::to_string(&restored).expect("json"));
}

#[test]
fn criu_rejecting_its_arguments_leaves_the_process_running() {
    let criu = criu();
    let counter = Counter::start();
    let dir = counter.image_dir("img");
    let opts = CheckpointOptions { extra_criu_args: vec!["--no-such-option".into()], ..CheckpointOptions::new(&criu) };
    let err = checkpoint::checkpoint(counter.pid, &dir, &opts).expect_err("CRIU rejects the option");
    let msg = err.to_string();
    eprintln!("rejected arguments: {msg}");
    assert!(matches!(err, GpuDumpError::Resumed { phase: Phase::CriuDump, .. }), "{err:?}");
    assert!(msg.starts_with("criu dump failed; the process was resumed"), "{msg}");
    assert!(msg.contains("unrecognized option '--no-such-option'"), "{msg}");
    assert!(!msg.contains("RLIMIT_NOFILE"), "{msg}");
    assert!(procfs::is_alive(counter.pid));
    let now = counter.value();
    counter.wait_above(now + 3, Duration::from_secs(5));
}

#[test]
fn criu_failing_after_the_freeze_thaws_the_process() {
    let criu = criu();
    let counter = Counter::start();
    // An action script that fails at post-dump: CRIU has frozen the tree and written the
    // image, then gives up and must thaw it instead of killing it.
    let script = counter.image_dir("fail-post-dump.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] && { echo refusing post-dump >&2; exit 1; }\nexit 0\n",
    )
    .expect("write script");
    let chmod = Command::new("chmod").arg("755").arg(&script).status().expect("chmod");
    assert!(chmod.success());
    let dir = counter.image_dir("img");
    let opts = CheckpointOptions {
        extra_criu_args: vec!["--action-script".into(), script.display().to_string()],
        ..CheckpointOptions::new(&criu)
    };
    let err = checkpoint::checkpoint(counter.pid, &dir, &opts).expect_err("post-dump script fails");
    let msg = err.to_string();
    eprintln!("failure after the freeze: {msg}");
    assert!(matches!(err, GpuDumpError::Resumed { phase: Phase::CriuDump, .. }), "{err:?}");
    assert!(msg.contains("criu dump failed; the process was resumed"), "{msg}");
    assert!(msg.contains("action scripts failed"), "the log tail is quoted: {msg}");
    assert!(msg.contains("last lines of CRIU's dump.log"), "{msg}");
    assert!(procfs::is_alive(counter.pid));
    let now = counter.value();
    counter.wait_above(now + 3, Duration::from_secs(5));
    // The half-written image is left for inspection, and a second checkpoint refuses to mix
    // into it.
    let err = checkpoint::checkpoint(counter.pid, &dir, &CheckpointOptions::new(&criu)).expect_err("dir in use");
    assert!(err.to_string().contains("already holds a CRIU image"), "{err}");
    assert!(procfs::is_alive(counter.pid));
}

#[test]
fn dead_and_zombie_pids_are_refused_clearly() {
    let criu = criu();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    // Not reaped yet: a zombie once it exits.
    wait_for(Duration::from_secs(5), || (procfs::state(pid) == Some('Z')).then_some(())).expect("a zombie");
    let err = checkpoint::checkpoint(pid, dir.path(), &CheckpointOptions::new(&criu)).expect_err("zombie");
    assert_eq!(err.to_string(), format!("no process with pid {pid} (only a zombie that has exited is left)"));
    child.wait().expect("reap");
    let err = checkpoint::checkpoint(pid, dir.path(), &CheckpointOptions::new(&criu)).expect_err("gone");
    assert!(matches!(err, GpuDumpError::NoSuchProcess { .. }), "{err:?}");
    assert_eq!(err.to_string(), format!("no process with pid {pid}"));
    assert!(std::fs::read_dir(dir.path()).expect("read dir").next().is_none(), "nothing was written");
}

#[test]
fn restore_refuses_while_the_original_still_runs() {
    let criu = criu();
    let counter = Counter::start();
    let dir = counter.image_dir("img");
    let opts = CheckpointOptions { leave_running: true, ..CheckpointOptions::new(&criu) };
    checkpoint::checkpoint(counter.pid, &dir, &opts).expect("checkpoint");
    let opts = RestoreOptions {
        original_pid: Some(counter.pid),
        pid_wait: Duration::from_millis(200),
        ..RestoreOptions::new(&criu)
    };
    let err = checkpoint::restore(&dir, &opts).expect_err("the original holds the pid");
    assert!(matches!(err, GpuDumpError::PidInUse { .. }), "{err:?}");
    assert!(err.to_string().contains("is still in use by another process"), "{err}");
    assert!(!dir.join("restore.log").exists(), "CRIU was not run");
    assert!(procfs::is_alive(counter.pid));
}

#[test]
fn restore_explains_a_file_that_grew_after_a_leave_running_dump() {
    let criu = criu();
    let counter = Counter::start_appending();
    let dir = counter.image_dir("img");
    let opts = CheckpointOptions { leave_running: true, ..CheckpointOptions::new(&criu) };
    checkpoint::checkpoint(counter.pid, &dir, &opts).expect("checkpoint");
    let at_dump = counter.value();
    counter.wait_above(at_dump + 3, Duration::from_secs(5));
    counter.kill();
    let opts = RestoreOptions { original_pid: Some(counter.pid), ..RestoreOptions::new(&criu) };
    let err = checkpoint::restore(&dir, &opts).expect_err("out.log grew since the dump");
    let msg = err.to_string();
    eprintln!("grown file: {msg}");
    assert!(matches!(err, GpuDumpError::CriuFailed { action: "restore", .. }), "{err:?}");
    assert!(msg.contains("has bad size"), "the log line is quoted: {msg}");
    assert!(msg.contains("a file the process had open changed size after the dump"), "{msg}");
    assert!(msg.contains("--leave-running") && msg.contains("CRIU cannot restore it"), "{msg}");
    // CRIU kills the half-restored task as it fails; it may take a moment to be gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while procfs::is_alive(counter.pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!procfs::is_alive(counter.pid), "a failed restore leaves no process behind");
}

#[test]
fn a_tree_restored_stopped_runs_nothing_until_resumed_and_dies_when_dropped() {
    let criu = criu();
    let counter = Counter::start();
    let dir = counter.image_dir("img");
    checkpoint::checkpoint(counter.pid, &dir, &CheckpointOptions::new(&criu)).expect("checkpoint");
    wait_for(Duration::from_secs(2), || (!procfs::is_alive(counter.pid)).then_some(())).expect("dump ended it");
    let at_dump = counter.value();
    let opts = RestoreOptions { original_pid: Some(counter.pid), ..RestoreOptions::new(&criu) };

    // Restored stopped: it is there, stopped, and counts nothing; dropped, it is killed.
    let stopped = checkpoint::restore_stopped(&dir, &opts).expect("restore stopped");
    assert_eq!(stopped.pid(), counter.pid);
    assert_eq!(procfs::state(counter.pid), Some('T'), "returned before it showed as stopped");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(counter.value(), at_dump, "a stopped tree counted");
    drop(stopped);
    wait_for(Duration::from_secs(5), || (!procfs::is_alive(counter.pid)).then_some(())).expect("dropped: killed");
    assert_eq!(counter.value(), at_dump, "the dropped tree never ran");

    // Restored stopped again and resumed: it counts on from the dump point.
    let stopped = checkpoint::restore_stopped(&dir, &opts).expect("restore stopped again");
    let restored = stopped.resume(&opts).expect("resume");
    assert_eq!(restored.pid, counter.pid);
    let later = counter.wait_above(at_dump + 3, Duration::from_secs(5));
    assert!(later <= at_dump + 200, "counter jumped from {at_dump} to {later}: not a continuation");
    counter.kill();
}
