//! The cluster's metadata: its nodes and replication factor, replicated by a Raft group of
//! its own (so no single process is a single point of failure), and the placement of every
//! shard derived from them.
//!
//! Placement is rendezvous hashing: a shard's replicas are the `rf` nodes with the highest
//! hash of (shard, node), and the first of them is its preferred leader. Adding or removing
//! a node moves only the replicas whose top-`rf` changes (about `rf`/n of them), and every
//! node computes the same placement from the same metadata. Placement counts only the
//! nodes not declared dead (see `liveness`): a dead node's replicas move to live ones, and
//! come back when it does.

use std::collections::BTreeMap;

use spindle_core::Value;

use crate::acl::{self, Acl};

/// Voters of the metadata group (the other nodes follow it as learners).
pub(crate) const META_VOTERS: usize = 3;

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Meta {
    /// Replicas per shard.
    pub(crate) rf: usize,
    /// The cluster's nodes and their addresses.
    pub(crate) nodes: BTreeMap<u64, String>,
    /// The cluster's users and roles.
    pub(crate) acl: Acl,
    /// The nodes the metadata group's leader declared not up (the others are up).
    pub(crate) liveness: BTreeMap<u64, Liveness>,
}

/// What the metadata group's leader declared of a node, from how long it has not heard it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Liveness {
    #[default]
    Up,
    /// Not heard for a while: redirects avoid it, its shards count it out of their quorum.
    Suspect,
    /// Not heard for `--dead-after`: placement no longer counts it.
    Dead,
}

impl Liveness {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Liveness::Up => "up",
            Liveness::Suspect => "suspect",
            Liveness::Dead => "dead",
        }
    }

    fn from_name(name: &str) -> Option<Liveness> {
        [Liveness::Up, Liveness::Suspect, Liveness::Dead]
            .into_iter()
            .find(|l| l.name() == name)
    }
}

/// A change to the metadata (an entry of the metadata group).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Command {
    AddNode { node: u64, address: String },
    RemoveNode { node: u64 },
    SetReplicationFactor { rf: usize },
    Acl(acl::Change),
    SetLiveness { node: u64, liveness: Liveness },
}

impl Command {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let value = match self {
            Command::AddNode { node, address } => {
                Value::Array(vec!["add".into(), (*node).into(), address.as_str().into()])
            }
            Command::RemoveNode { node } => Value::Array(vec!["remove".into(), (*node).into()]),
            Command::SetReplicationFactor { rf } => Value::Array(vec!["rf".into(), (*rf as u64).into()]),
            Command::Acl(change) => Value::Array(vec!["acl".into(), change.to_value()]),
            Command::SetLiveness { node, liveness } => {
                Value::Array(vec!["live".into(), (*node).into(), liveness.name().into()])
            }
        };
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &value).expect("encoding to memory");
        out
    }

    pub(crate) fn decode(data: &[u8]) -> Result<Command, String> {
        let value = rmpv::decode::read_value(&mut &data[..]).map_err(|e| e.to_string())?;
        let items = value.as_array().ok_or("a metadata entry is not an array")?;
        let uint = |i: usize| {
            items
                .get(i)
                .and_then(Value::as_u64)
                .ok_or("a metadata entry lacks a number")
        };
        match items.first().and_then(Value::as_str) {
            Some("add") => Ok(Command::AddNode {
                node: uint(1)?,
                address: items
                    .get(2)
                    .and_then(Value::as_str)
                    .ok_or("an add lacks its address")?
                    .to_string(),
            }),
            Some("remove") => Ok(Command::RemoveNode { node: uint(1)? }),
            Some("rf") => Ok(Command::SetReplicationFactor { rf: uint(1)? as usize }),
            Some("acl") => Ok(Command::Acl(acl::Change::from_value(
                items.get(1).ok_or("an acl entry lacks its change")?,
            )?)),
            Some("live") => Ok(Command::SetLiveness {
                node: uint(1)?,
                liveness: items
                    .get(2)
                    .and_then(Value::as_str)
                    .and_then(Liveness::from_name)
                    .ok_or("a liveness entry lacks up, suspect or dead")?,
            }),
            _ => Err("an unknown metadata entry".into()),
        }
    }
}

impl Meta {
    pub(crate) fn apply(&mut self, command: Command) {
        match command {
            Command::AddNode { node, address } => {
                self.nodes.insert(node, address);
            }
            Command::RemoveNode { node } => {
                self.nodes.remove(&node);
                self.liveness.remove(&node);
            }
            Command::SetReplicationFactor { rf } => self.rf = rf.max(1),
            Command::Acl(change) => self.acl.apply(change),
            Command::SetLiveness { node, liveness } if self.nodes.contains_key(&node) => {
                match liveness {
                    Liveness::Up => self.liveness.remove(&node),
                    _ => self.liveness.insert(node, liveness),
                };
            }
            Command::SetLiveness { .. } => {}
        }
    }

    /// What was last declared of `node`.
    pub(crate) fn liveness(&self, node: u64) -> Liveness {
        self.liveness.get(&node).copied().unwrap_or_default()
    }

    /// Group `group`'s replicas, most preferred (its leader) first: `count` nodes not
    /// declared dead (any node while every one is).
    pub(crate) fn placement(&self, group: u64, count: usize) -> Vec<u64> {
        let live: Vec<u64> = self
            .nodes
            .keys()
            .copied()
            .filter(|&n| self.liveness(n) != Liveness::Dead)
            .collect();
        let candidates = match live.is_empty() {
            true => self.nodes.keys().copied().collect(),
            false => live,
        };
        let mut ranked: Vec<(u64, u64)> = candidates.into_iter().map(|n| (score(group, n), n)).collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        ranked.into_iter().take(count).map(|(_, n)| n).collect()
    }

    /// The replicas of shard `shard`.
    pub(crate) fn shard_replicas(&self, shard: u64) -> Vec<u64> {
        self.placement(shard, self.rf.max(1))
    }

    /// The voters of the metadata group (`meta_group` is its index).
    pub(crate) fn meta_voters(&self, meta_group: u64) -> Vec<u64> {
        self.placement(meta_group, META_VOTERS)
    }
}

/// Rendezvous score of a node for a group (a 64-bit mix of both: SplitMix64's finalizer).
fn score(group: u64, node: u64) -> u64 {
    let mut z = group.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ node.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(nodes: &[u64], rf: usize) -> Meta {
        Meta {
            rf,
            nodes: nodes.iter().map(|&n| (n, format!("h:{n}"))).collect(),
            acl: Acl::default(),
            liveness: BTreeMap::new(),
        }
    }

    #[test]
    fn commands_round_trip() {
        for c in [
            Command::AddNode {
                node: 3,
                address: "127.0.0.1:7003".into(),
            },
            Command::RemoveNode { node: 2 },
            Command::SetReplicationFactor { rf: 2 },
            Command::Acl(acl::Change::RemoveUser { name: "eve".into() }),
            Command::SetLiveness {
                node: 4,
                liveness: Liveness::Dead,
            },
            Command::SetLiveness {
                node: 4,
                liveness: Liveness::Up,
            },
        ] {
            assert_eq!(Command::decode(&c.encode()), Ok(c));
        }
        assert!(Command::decode(b"\x91\xa3bad").is_err());
        let bad = Value::Array(vec!["live".into(), 4u64.into(), "asleep".into()]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &bad).unwrap();
        assert!(Command::decode(&bytes).is_err());
    }

    #[test]
    fn placement_leaves_out_dead_nodes_and_takes_them_back_when_they_are_up() {
        let mut four = meta(&[1, 2, 3, 4], 3);
        let before: Vec<Vec<u64>> = (0..16).map(|s| four.shard_replicas(s)).collect();
        let dead = |node, liveness| Command::SetLiveness { node, liveness };
        four.apply(dead(2, Liveness::Suspect));
        assert_eq!((0..16).map(|s| four.shard_replicas(s)).collect::<Vec<_>>(), before);
        four.apply(dead(2, Liveness::Dead));
        for s in 0..16 {
            let r = four.shard_replicas(s);
            assert_eq!(r.len(), 3);
            assert!(!r.contains(&2), "shard {s} placed on a dead node");
            // Only the shards that had a replica on node 2 move.
            if !before[s as usize].contains(&2) {
                assert_eq!(r, before[s as usize]);
            }
        }
        four.apply(dead(2, Liveness::Up));
        assert_eq!((0..16).map(|s| four.shard_replicas(s)).collect::<Vec<_>>(), before);
        // A removed node's mark goes with it; a mark for a non-member is ignored.
        four.apply(dead(2, Liveness::Dead));
        four.apply(Command::RemoveNode { node: 2 });
        four.apply(dead(9, Liveness::Dead));
        assert!(four.liveness.is_empty());
    }

    #[test]
    fn placement_spreads_replicas_and_moves_few_on_a_join() {
        let three = meta(&[1, 2, 3], 1);
        let shards = 64;
        let mut load = BTreeMap::new();
        for s in 0..shards {
            let r = three.shard_replicas(s);
            assert_eq!(r.len(), 1);
            *load.entry(r[0]).or_insert(0) += 1;
        }
        // Keyed by node: a node that holds no shard is missing, not a zero.
        assert_eq!(
            load.keys().copied().collect::<Vec<u64>>(),
            [1, 2, 3],
            "every node holds shards"
        );
        assert!(
            load.values().all(|&n| n >= 10),
            "every node holds enough shards: {load:?}"
        );
        // A fourth node takes shards only from the others: none moves between old nodes.
        let four = meta(&[1, 2, 3, 4], 1);
        let moved: Vec<u64> = (0..shards)
            .filter(|&s| three.shard_replicas(s) != four.shard_replicas(s))
            .collect();
        assert!(moved.iter().all(|&s| four.shard_replicas(s) == vec![4]));
        assert!(!moved.is_empty() && moved.len() < 32);
        // With rf = 3 of 3 nodes every shard is everywhere.
        let full = meta(&[1, 2, 3], 3);
        let mut r = full.shard_replicas(7);
        r.sort_unstable();
        assert_eq!(r, vec![1, 2, 3]);
    }
}
