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
    /// Remove node ID from the cluster while it serves: its replicas move to other nodes
    /// first (and leadership away from it); then it may be stopped. New nodes join with
    /// `spindle server --node-id N --join HOST:PORT`.
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

/// Each group as its leader sees it (a node knows only the groups it holds), from the maps
/// of every node that answers, then the metadata group's.
fn leaders_views(map: &Value) -> (Vec<Value>, Value) {
    let mut groups = field(map, "groups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    groups.push(field(map, "metadata").cloned().unwrap_or(Value::Nil));
    let nodes = field(map, "nodes").and_then(Value::as_map).cloned().unwrap_or_default();
    let views: Vec<Value> = nodes
        .iter()
        .filter_map(|(_, a)| cluster_map(a.as_str()?).ok())
        .collect();
    for view in &views {
        let node = field(view, "node").and_then(Value::as_u64);
        let mut theirs = field(view, "groups")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        theirs.push(field(view, "metadata").cloned().unwrap_or(Value::Nil));
        for (mine, their) in groups.iter_mut().zip(theirs) {
            if node.is_some() && field(&their, "leader").and_then(Value::as_u64) == node {
                *mine = their;
            }
        }
    }
    let metadata = groups.pop().unwrap_or(Value::Nil);
    (groups, metadata)
}

fn status(address: &str) -> Result<(), String> {
    let map = cluster_map(address)?;
    let nodes = field(&map, "nodes")
        .and_then(Value::as_map)
        .cloned()
        .unwrap_or_default();
    let (groups, metadata) = leaders_views(&map);
    println!(
        "{} nodes, {} shards, {} replicas each",
        nodes.len(),
        groups.len(),
        field(&map, "replication_factor").and_then(Value::as_u64).unwrap_or(0)
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
        "{:<6} {:<8} {:<12} {:<10} {:<12} {:>6} {:>10} {:>10}  health",
        "shard", "leader", "voters", "learners", "placement", "term", "commit", "applied"
    );
    for g in groups.iter().chain(std::iter::once(&metadata)) {
        let num = |name: &str| field(g, name).and_then(Value::as_u64).unwrap_or(0);
        let list = |name: &str| {
            let v = ids(field(g, name));
            if v.is_empty() {
                "-".to_string()
            } else {
                v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
            }
        };
        let (voters, placement) = (ids(field(g, "voters")), ids(field(g, "placement")));
        let mut settled = voters.clone();
        settled.sort_unstable();
        let mut placed = placement.clone();
        placed.sort_unstable();
        let health = match num("leader") {
            0 => "no leader".to_string(),
            _ if settled != placed => "up, moving".to_string(),
            _ => "up".to_string(),
        };
        let name = match std::ptr::eq(g, &metadata) {
            true => "meta".to_string(),
            false => num("shard").to_string(),
        };
        let leader = match num("leader") {
            0 => "-".to_string(),
            n => n.to_string(),
        };
        println!(
            "{:<6} {:<8} {:<12} {:<10} {:<12} {:>6} {:>10} {:>10}  {health}",
            name,
            leader,
            list("voters"),
            list("learners"),
            list("placement"),
            num("term"),
            num("commit"),
            num("applied")
        );
    }
    Ok(())
}

fn remove(address: &str, node: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut asked = false;
    loop {
        let map = cluster_map(address)?;
        let (mut groups, metadata) = leaders_views(&map);
        let is_member =
            |g: &Value| ids(field(g, "voters")).contains(&node) || ids(field(g, "learners")).contains(&node);
        let listed = field(&map, "nodes")
            .and_then(Value::as_map)
            .is_some_and(|nodes| nodes.iter().any(|(id, _)| id.as_u64() == Some(node)));
        if !asked && !listed {
            return Err(format!("node {node} is not a member of the cluster"));
        }
        groups.push(metadata.clone());
        let member = groups.iter().filter(|g| is_member(g)).count();
        if !listed && member == 0 {
            println!("node {node} left the cluster: it holds no replica any more and can be stopped");
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("node {node} still holds {member} replicas after 120 s"));
        }
        if listed {
            // The metadata group's leader takes the request; retried until it is recorded.
            if let Some(leader) = field(&metadata, "leader_address").and_then(Value::as_str) {
                if let Ok(mut client) = Client::connect(leader) {
                    asked |= client.leave(node).is_ok();
                }
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}
