//! `spindle cluster status|remove`: look at a cluster's shard map, and take a node out.

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use spindle_core::Value;

use crate::client::Client;

#[derive(Args)]
pub(crate) struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Show the cluster's nodes and each shard's voters, learners, leader and progress.
    Status {
        #[command(flatten)]
        address: crate::AddressArg,
    },
    /// Remove node ID from every shard while the cluster serves (its shards' leadership
    /// moves away first), then stop it. New nodes join with `spindle server --join`.
    Remove {
        /// The node's id (`--node-id` it was started with).
        node: u64,
        #[command(flatten)]
        address: crate::AddressArg,
    },
}

pub(crate) fn run(args: ClusterArgs) -> Result<(), String> {
    match args.command {
        ClusterCommand::Status { address } => status(&address.address),
        ClusterCommand::Remove { node, address } => remove(&address.address, node),
    }
}

fn field<'a>(map: &'a Value, name: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

fn ids(value: Option<&Value>) -> Vec<u64> {
    value
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

fn cluster_map(address: &str) -> Result<Value, String> {
    Client::connect(address)?.cluster()
}

fn status(address: &str) -> Result<(), String> {
    let map = cluster_map(address)?;
    let nodes = field(&map, "nodes")
        .and_then(Value::as_map)
        .cloned()
        .unwrap_or_default();
    let groups = field(&map, "groups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    println!(
        "node {} answered; {} shards",
        field(&map, "node").and_then(Value::as_u64).unwrap_or(0),
        groups.len()
    );
    println!();
    println!("{:<6} {:<24} {:>8}", "node", "address", "leading");
    for (id, addr) in &nodes {
        let id = id.as_u64().unwrap_or(0);
        let leading = groups
            .iter()
            .filter(|g| field(g, "leader").and_then(Value::as_u64) == Some(id))
            .count();
        println!("{id:<6} {:<24} {leading:>8}", addr.as_str().unwrap_or("?"));
    }
    println!();
    println!(
        "{:<6} {:<8} {:<12} {:<10} {:>6} {:>10} {:>10}  health",
        "shard", "leader", "voters", "learners", "term", "commit", "applied"
    );
    for g in &groups {
        let num = |name: &str| field(g, name).and_then(Value::as_u64).unwrap_or(0);
        let list = |name: &str| {
            let v = ids(field(g, name));
            if v.is_empty() {
                "-".to_string()
            } else {
                v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
            }
        };
        let voters = ids(field(g, "voters"));
        let health = match num("leader") {
            0 => "no leader".to_string(),
            _ if voters.len() < 3 => format!("up, {} replica(s)", voters.len()),
            _ => "up".to_string(),
        };
        let leader = match num("leader") {
            0 => "-".to_string(),
            n => n.to_string(),
        };
        println!(
            "{:<6} {:<8} {:<12} {:<10} {:>6} {:>10} {:>10}  {health}",
            num("shard"),
            leader,
            list("voters"),
            list("learners"),
            num("term"),
            num("commit"),
            num("applied")
        );
    }
    Ok(())
}

fn remove(address: &str, node: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let map = cluster_map(address)?;
        let groups = field(&map, "groups")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let member: Vec<&Value> = groups
            .iter()
            .filter(|g| ids(field(g, "voters")).contains(&node) || ids(field(g, "learners")).contains(&node))
            .collect();
        if member.is_empty() {
            println!("node {node} is in no shard any more; it can be stopped");
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("node {node} is still in {} shards after 60 s", member.len()));
        }
        for g in member {
            let shard = field(g, "shard").and_then(Value::as_u64).unwrap_or(0);
            // Ask the shard's leader; refusals (busy, moving leadership) are retried.
            if let Some(leader) = field(g, "leader_address").and_then(Value::as_str) {
                if let Ok(mut client) = Client::connect(leader) {
                    let _ = client.leave(node, shard);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}
