//! The c10d process group across real processes on this machine (Gloo over loopback):
//! ranks started by hand as torchrun would, ranks started by torchrun itself, a rank
//! whose peer never comes, and a rank whose peer dies mid-collective.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use common::cli::{fails_with, succeeds};

/// A port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `lethe dist-check` as rank `rank` of `world` with the rendezvous at 127.0.0.1:`port`.
fn rank(rank: usize, world: usize, port: u16, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lethe"));
    c.arg("dist-check").args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.env("RANK", rank.to_string()).env("WORLD_SIZE", world.to_string()).env("LOCAL_RANK", rank.to_string());
    c.env("MASTER_ADDR", "127.0.0.1").env("MASTER_PORT", port.to_string()).env_remove("TORCHELASTIC_USE_AGENT_STORE");
    c
}

fn spawn(mut c: Command) -> Child {
    c.spawn().expect("start lethe")
}

fn finish(child: Child) -> Output {
    child.wait_with_output().expect("wait for lethe")
}

#[test]
fn two_ranks_over_loopback_reduce_broadcast_and_meet() {
    let port = free_port();
    let args = ["--elements", "4096", "--rounds", "3", "--timeout", "60"];
    let ranks = [spawn(rank(0, 2, port, &args)), spawn(rank(1, 2, port, &args))];
    for (r, child) in ranks.into_iter().enumerate() {
        let out = succeeds(&finish(child));
        assert!(out.contains(&format!("rank {r}/2: joined")) && out.contains("rank 0's store"), "{out}");
        assert!(out.contains("all-reduce of 4096 floats right") && out.contains("broadcast right"), "{out}");
    }
}

#[test]
fn torchrun_starts_the_ranks_and_they_meet_through_its_store() {
    let port = free_port().to_string();
    let out = Command::new("torchrun")
        .args(["--nproc-per-node", "2", "--master-port", &port, "--no-python", env!("CARGO_BIN_EXE_lethe")])
        .args(["dist-check", "--elements", "1024", "--rounds", "2", "--timeout", "60"])
        .stdin(Stdio::null())
        .output()
        .expect("torchrun is on PATH after `. scripts/env.sh` (the torch wheel's launcher)");
    let stdout = succeeds(&out);
    for r in 0..2 {
        assert!(stdout.contains(&format!("rank {r}/2: joined")), "{stdout}");
    }
    assert_eq!(stdout.matches("torchrun's store").count(), 2, "{stdout}");
    assert_eq!(stdout.matches("all-reduce of 1024 floats right").count(), 2, "{stdout}");
}

#[test]
fn a_rank_whose_peer_never_comes_gives_up_naming_the_store() {
    let port = free_port();
    let out = finish(spawn(rank(0, 2, port, &["--timeout", "2"])));
    fails_with(&out, &["rank 0", "could not join the group of 2", &format!("127.0.0.1:{port}")]);
}

#[test]
fn a_peer_killed_mid_run_ends_the_other_rank_with_an_error() {
    let port = free_port();
    let args = ["--elements", "65536", "--rounds", "1000000", "--timeout", "10"];
    let survivor = spawn(rank(0, 2, port, &args));
    let mut victim = spawn(rank(1, 2, port, &args));
    let mut first = String::new();
    BufReader::new(victim.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.contains("rank 1/2: joined"), "{first}");
    victim.kill().unwrap();
    victim.wait().unwrap();
    fails_with(&finish(survivor), &["rank 0", "all-reduce failed", "is a peer gone?"]);
}

#[test]
fn dist_check_outside_a_launch_says_how_to_start_one() {
    let out = Command::new(env!("CARGO_BIN_EXE_lethe")).arg("dist-check").env_remove("WORLD_SIZE").output().unwrap();
    fails_with(&out, &["WORLD_SIZE is not set", "torchrun"]);
}
