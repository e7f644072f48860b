//! Which node should hold how many shards, and which ones it prefers: pure
//! arithmetic every node computes alike from the same view, with no messages.
//!
//! Each live node's share is `shards / nodes`, the first `shards % nodes` of them in
//! id order holding one more, so the shares add up to the shard count exactly and a
//! node above its share always has someone below it to hand over to. A node prefers
//! shards by a hash of its id and the shard (rendezvous), so two nodes claiming at
//! once mostly reach for different shards, and a node that restarts reaches for the
//! ones it held before.

/// How many shards `me` should hold among `nodes` (live node ids, any order). 0 when
/// `me` is not among them.
pub fn fair_share<'a>(shards: u32, nodes: impl IntoIterator<Item = &'a str>, me: &str) -> u32 {
    let mut ids: Vec<&str> = nodes.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    let Some(rank) = ids.iter().position(|id| *id == me) else {
        return 0;
    };
    let n = ids.len() as u32;
    shards / n + u32::from((rank as u32) < shards % n)
}

/// The shard tenant `tenant` lives in, of `shards`: fixed by its name, so every node
/// finds it without asking anyone.
pub fn shard_of(tenant: &str, shards: u32) -> u32 {
    (stable_hash(tenant.as_bytes()) % u64::from(shards.max(1))) as u32
}

/// How much `node` wants `shard`: higher first.
pub fn preference(node: &str, shard: u32) -> u64 {
    let mut key = node.as_bytes().to_vec();
    key.extend_from_slice(&shard.to_be_bytes());
    stable_hash(&key)
}

/// FNV-1a then a finaliser: the same on every node and in every version, unlike the
/// standard library's hashers.
fn stable_hash(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}

/// `candidates` ordered as `node` prefers them.
pub fn by_preference(node: &str, candidates: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut ordered: Vec<u32> = candidates.into_iter().collect();
    ordered.sort_by_key(|&shard| std::cmp::Reverse(preference(node, shard)));
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_the_shard_count_and_differ_by_at_most_one() {
        for shards in [1, 2, 7, 16, 100] {
            for n in 1..=9 {
                let ids: Vec<String> = (0..n).map(|i| format!("node-{i}")).collect();
                let shares: Vec<u32> = ids
                    .iter()
                    .map(|me| fair_share(shards, ids.iter().map(String::as_str), me))
                    .collect();
                assert_eq!(shares.iter().sum::<u32>(), shards, "{shards} over {n}");
                let (min, max) = (shares.iter().min(), shares.iter().max());
                assert!(max.unwrap() - min.unwrap() <= 1, "{shares:?}");
            }
        }
    }

    #[test]
    fn a_node_not_in_the_view_holds_nothing() {
        assert_eq!(fair_share(16, ["a", "b"], "c"), 0);
        assert_eq!(fair_share(16, ["a", "b", "c"], "a"), 6);
        assert_eq!(fair_share(16, ["c", "a", "b"], "c"), 5);
    }

    #[test]
    fn tenants_spread_over_the_shards() {
        let mut counts = [0u32; 8];
        for i in 0..800 {
            counts[shard_of(&format!("tenant-{i}"), 8) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 60), "{counts:?}");
        assert_eq!(shard_of("default", 1), 0);
    }

    #[test]
    fn nodes_prefer_different_shards() {
        let first = |node: &str| by_preference(node, 0..16)[0];
        let firsts: std::collections::HashSet<u32> =
            ["a", "b", "c", "d"].iter().map(|n| first(n)).collect();
        assert!(firsts.len() > 1, "every node prefers the same shard");
        assert_eq!(by_preference("a", 0..16), by_preference("a", 0..16));
    }
}
