//! `slipway sim`: the simulator from the command line.

mod common;

use common::World;

#[test]
fn sim_prints_a_row_per_policy_and_rejects_unknown_traces() {
    let w = World::new();
    let run = w.run(&["sim", "--trace", "weekend", "--seed", "3"]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    for policy in ["baseline", "slipway", "oracle"] {
        assert!(
            run.stdout.lines().any(|l| l.starts_with(policy)),
            "no {policy} row:\n{}",
            run.stdout
        );
    }
    let csv = w.write(
        "t.csv",
        "arrival_s,duration_s,cpu,memory\n0,60,1,1\n10,oops,1,1\n",
    );
    let bad = w.run(&["sim", "--trace", csv.to_str().expect("csv")]);
    assert_eq!(bad.code, Some(2), "{}", bad.explain());
    assert!(bad.stderr.contains("t.csv"), "{}", bad.explain());
    assert!(
        bad.stderr.contains('3'),
        "line number expected: {}",
        bad.explain()
    );
}
