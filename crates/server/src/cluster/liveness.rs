//! Node liveness, decided by one authority: the metadata group's leader. It hears from every
//! node (its heartbeats reach every member of the metadata group, voters and learners, and
//! each answers), and declares a node `suspect` when it has not heard it for a while and
//! `dead` after `--dead-after`, as entries of the metadata group: so every node holds the
//! same verdicts, placement leaves dead nodes out, and redirects avoid suspect and dead ones.
//! A node declared dead that is heard again is declared up: placement takes it back and its
//! replicas move back, catching up from their shards' leaders.

use ahash::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::meta::{Command, Liveness, Meta};

/// `--dead-after` unless given: CockroachDB's `server.time_until_store_dead`.
pub const DEFAULT_DEAD_AFTER: Duration = Duration::from_secs(300);
/// A node not heard for this long is suspect (or for half of `--dead-after`, if shorter):
/// several election timeouts, so that a busy moment is no suspicion.
const SUSPECT_AFTER: Duration = Duration::from_secs(2);
/// A verdict proposed and not applied after this long is proposed again.
const PROPOSE_AGAIN: Duration = Duration::from_secs(1);

/// When this node last heard from each other node (any Raft message).
#[derive(Default)]
pub(crate) struct Heard(Mutex<HashMap<u64, Instant>>);

impl Heard {
    pub(crate) fn record(&self, node: u64) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node, Instant::now());
    }

    pub(crate) fn last(&self, node: u64) -> Option<Instant> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(&node).copied()
    }
}

/// The metadata group leader's judge: what it declares of the nodes, from what it heard
/// since it became leader.
pub(crate) struct Judge {
    /// When the judge first saw each node (as it became the leader, or when the node was
    /// added): a node is given `--dead-after` from then, heard or not.
    seen: HashMap<u64, Instant>,
    /// Verdicts proposed and when, not yet applied.
    asked: HashMap<u64, (Liveness, Instant)>,
}

impl Judge {
    pub(crate) fn new() -> Judge {
        Judge {
            seen: HashMap::default(),
            asked: HashMap::default(),
        }
    }

    /// The verdicts to propose now: those that change what `meta` says of a node (this node,
    /// `me`, is up), each once per [`PROPOSE_AGAIN`].
    pub(crate) fn verdicts(
        &mut self,
        meta: &Meta,
        me: u64,
        heard: impl Fn(u64) -> Option<Instant>,
        dead_after: Duration,
        now: Instant,
    ) -> Vec<Command> {
        let suspect_after = SUSPECT_AFTER.min(dead_after / 2);
        self.asked.retain(|node, (liveness, at)| {
            meta.liveness(*node) != *liveness && now.duration_since(*at) < PROPOSE_AGAIN
        });
        self.seen.retain(|node, _| meta.nodes.contains_key(node));
        let mut out = Vec::new();
        for &node in meta.nodes.keys() {
            let seen = *self.seen.entry(node).or_insert(now);
            let last = heard(node);
            let silent = |from: Instant| now.saturating_duration_since(from);
            let declared = meta.liveness(node);
            let wanted = if node == me {
                Liveness::Up
            } else if declared == Liveness::Dead {
                // Only a node actually heard again comes back (not one merely given time).
                match last.is_some_and(|t| silent(t) <= suspect_after) {
                    true => Liveness::Up,
                    false => Liveness::Dead,
                }
            } else {
                match silent(last.map_or(seen, |t| t.max(seen))) {
                    s if s > dead_after => Liveness::Dead,
                    s if s > suspect_after => Liveness::Suspect,
                    _ => Liveness::Up,
                }
            };
            if wanted != declared && self.asked.get(&node).is_none_or(|(l, _)| *l != wanted) {
                self.asked.insert(node, (wanted, now));
                out.push(Command::SetLiveness { node, liveness: wanted });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(nodes: &[u64]) -> Meta {
        Meta {
            rf: 3,
            nodes: nodes.iter().map(|&n| (n, format!("h:{n}"))).collect(),
            ..Meta::default()
        }
    }

    #[test]
    fn a_silent_node_becomes_suspect_then_dead_and_up_again_once_heard() {
        let start = Instant::now();
        let mut meta = meta(&[1, 2, 3]);
        let mut judge = Judge::new();
        assert!(judge
            .verdicts(&meta, 1, |_| None, Duration::from_secs(10), start)
            .is_empty());
        let dead_after = Duration::from_secs(10);
        let at = |s: u64| start + Duration::from_secs(s);
        // Node 3 answers all along; node 2 is never heard (given time from the start).
        let heard = |now: Instant| move |n: u64| (n == 3).then_some(now);
        let mut judge_at = |meta: &mut Meta, s: u64, heard: &dyn Fn(u64) -> Option<Instant>| {
            let out = judge.verdicts(meta, 1, heard, dead_after, at(s));
            for c in out.clone() {
                meta.apply(c);
            }
            out
        };
        assert!(judge_at(&mut meta, 1, &heard(at(1))).is_empty());
        let suspect = Command::SetLiveness {
            node: 2,
            liveness: Liveness::Suspect,
        };
        assert_eq!(judge_at(&mut meta, 3, &heard(at(3))), vec![suspect]);
        assert!(judge_at(&mut meta, 4, &heard(at(4))).is_empty(), "said once");
        let dead = Command::SetLiveness {
            node: 2,
            liveness: Liveness::Dead,
        };
        assert_eq!(judge_at(&mut meta, 11, &heard(at(11))), vec![dead]);
        // Heard long ago does not revive it; heard now does.
        let long_ago = |n: u64| Some(if n == 2 { at(5) } else { at(12) });
        assert!(judge_at(&mut meta, 12, &long_ago).is_empty());
        let now = |_| Some(at(13));
        let up = Command::SetLiveness {
            node: 2,
            liveness: Liveness::Up,
        };
        assert_eq!(judge_at(&mut meta, 13, &now), vec![up]);
        assert!(meta.liveness.is_empty());
    }

    #[test]
    fn a_new_leader_gives_every_node_time_but_revives_no_dead_one_unheard() {
        let start = Instant::now();
        let mut meta = meta(&[1, 2, 3]);
        meta.apply(Command::SetLiveness {
            node: 3,
            liveness: Liveness::Dead,
        });
        meta.apply(Command::SetLiveness {
            node: 1,
            liveness: Liveness::Suspect,
        });
        let mut judge = Judge::new();
        let dead_after = Duration::from_secs(300);
        let up = Command::SetLiveness {
            node: 1,
            liveness: Liveness::Up,
        };
        assert_eq!(judge.verdicts(&meta, 1, |_| None, dead_after, start), vec![up]);
        // Node 2 had no time to be suspect; dead node 3 stays dead; this node's verdict is
        // not asked again within a second.
        let out = judge.verdicts(&meta, 1, |_| None, dead_after, start + Duration::from_millis(500));
        assert!(out.is_empty(), "{out:?}");
        // A node added later is given its time from then, not from the judge's start.
        meta.apply(Command::AddNode {
            node: 4,
            address: "h:4".into(),
        });
        let out = judge.verdicts(&meta, 1, |_| None, dead_after, start + Duration::from_secs(400));
        assert!(
            !out.iter().any(|c| matches!(c, Command::SetLiveness { node: 4, .. })),
            "{out:?}"
        );
    }
}
