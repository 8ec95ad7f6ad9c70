//! `kill -9` of a push at random moments must leave a store that verifies clean and whose
//! earlier images all restore byte-exact.

use gstore_tests::*;
use rand::{Rng, SeedableRng};
use std::fs;
use std::time::{Duration, Instant};

#[test]
fn kill_9_during_push_never_damages_the_store() {
    // Small packs so one push writes many of them: more moments to be killed at.
    let env = Env::new(&["--pack-size", "1048576"]);
    let base = env.path("base");
    make_tree(&base, 100, 6_000_000);
    env.ok(&["push", base.to_str().unwrap(), "--tag", "base"]);

    // A larger source that takes a while to push; rewritten with fresh data each round so
    // every round writes new packs.
    let big = env.path("big");
    fs::create_dir_all(&big).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);

    // Measure one full push to spread the kill points over its whole length.
    write_mixed_file(&big.join("pages.img"), 48_000_000, 1);
    let t = Instant::now();
    env.ok(&["push", big.to_str().unwrap(), "--tag", "big:full"]);
    let full = t.elapsed();

    let mut killed_midway = 0;
    for round in 0..24u64 {
        write_mixed_file(&big.join("pages.img"), 48_000_000, 1000 + round);
        let mut child =
            env.cmd(&["-q", "push", big.to_str().unwrap(), "--tag", &format!("big:r{round}")]).spawn().unwrap();
        let delay = Duration::from_micros(rng.random_range(0..(full.as_micros() as u64 * 11 / 10).max(1)));
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            killed_midway += 1;
        }
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();

        // After every kill: the store verifies clean and the earlier images restore exactly.
        let out = env.run(&["verify", "--read-data"]);
        assert!(
            out.status.success(),
            "round {round}: verify failed after kill at {delay:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let dest = env.path(&format!("restored-{round}"));
        env.ok(&["restore", "base", "--to", dest.to_str().unwrap()]);
        assert_same_tree(&base, &dest);
        fs::remove_dir_all(&dest).unwrap();
    }
    assert!(killed_midway >= 12, "only {killed_midway} of 24 kills hit a running push");

    // The store still takes new pushes, and the killed ones' tags never half-exist.
    for t in env.json(&["ls"]).as_array().unwrap() {
        assert!(t["error"].is_null(), "{t}");
    }
    env.ok(&["push", big.to_str().unwrap(), "--tag", "big:after"]);
    env.ok(&["restore", "big:after", "--to", env.path("after").to_str().unwrap()]);
    assert_same_tree(&big, &env.path("after"));
}
