//! The single-writer subscription trie: an arena of nodes keyed by native tokens.
//!
//! Owns [`Trie`] and [`QueueGroup`]: where subscriptions live and how a subject finds them.
//! Must never allocate while matching, never copy subscribers out to report a match (it
//! hands out slices), never let a leading wildcard match a `$`-subject, and never keep a
//! node that holds nothing. It knows nothing about threads: [`crate::SharedTrie`] makes it
//! concurrent.
//!
//! ```text
//!  node ─┬─ children: token → node   (a small Vec while ≤ 8, then an FxHashMap)
//!        ├─ subs:  plain subscribers + queue groups of patterns ending here
//!        └─ wild (boxed, only when used):
//!             ├─ one:  node for `*` / `+`
//!             ├─ more: subscribers of `…>`  (one or more tokens: always a leaf)
//!             └─ zero: subscribers of `…/#` (zero or more tokens: always a leaf)
//! ```

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use rustc_hash::FxBuildHasher;
use slab::Slab;

use crate::pattern::{Pattern, PatternToken};

/// Children kept in a plain Vec up to this many; a hash map beyond.
const SMALL_MAX: usize = 8;
/// Marks "no node" in an index slot.
const NONE: usize = usize::MAX;

/// A queue group on one node: each message goes to one of its members, picked at delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueGroup<T> {
    /// The group's name.
    pub name: Box<str>,
    /// Its members, in subscription order.
    pub members: Vec<T>,
}

/// The subscribers of one pattern ending.
#[derive(Debug)]
struct Subs<T> {
    plain: Vec<T>,
    queues: Vec<QueueGroup<T>>,
}

impl<T: PartialEq> Subs<T> {
    fn new() -> Box<Self> {
        Box::new(Subs {
            plain: Vec::new(),
            queues: Vec::new(),
        })
    }

    fn insert(&mut self, queue: Option<&str>, value: T) {
        let list = match queue {
            None => &mut self.plain,
            Some(name) => {
                let at = match self.queues.iter().position(|q| &*q.name == name) {
                    Some(at) => at,
                    None => {
                        self.queues.reserve_exact(1);
                        self.queues.push(QueueGroup {
                            name: name.into(),
                            members: Vec::new(),
                        });
                        self.queues.len() - 1
                    }
                };
                &mut self.queues[at].members
            }
        };
        // Most endings hold one subscriber: give it exactly one slot, then grow by doubling.
        if list.capacity() == 0 {
            list.reserve_exact(1);
        }
        list.push(value);
    }

    fn remove(&mut self, queue: Option<&str>, value: &T) -> bool {
        match queue {
            None => remove_one(&mut self.plain, value),
            Some(name) => {
                let Some(at) = self.queues.iter().position(|q| &*q.name == name) else {
                    return false;
                };
                let removed = remove_one(&mut self.queues[at].members, value);
                if self.queues[at].members.is_empty() {
                    self.queues.swap_remove(at);
                }
                removed
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.plain.is_empty() && self.queues.is_empty()
    }
}

/// Removes the first element equal to `value`, keeping the order of the rest.
fn remove_one<T: PartialEq>(list: &mut Vec<T>, value: &T) -> bool {
    match list.iter().position(|v| v == value) {
        Some(at) => {
            list.remove(at);
            if list.is_empty() {
                *list = Vec::new();
            }
            true
        }
        None => false,
    }
}

/// Removes `value` from the subscribers in `slot`, dropping them when they become empty.
fn remove_from<T: PartialEq>(
    slot: &mut Option<Box<Subs<T>>>,
    queue: Option<&str>,
    value: &T,
) -> bool {
    let Some(subs) = slot else { return false };
    let removed = subs.remove(queue, value);
    if subs.is_empty() {
        *slot = None;
    }
    removed
}

/// Longest token kept inline in a [`Key`].
const INLINE_MAX: usize = 22;

/// A token as a child key: inline up to [`INLINE_MAX`] bytes (no allocation, and a lookup
/// compares it without chasing a pointer), boxed beyond. 24 bytes either way.
#[derive(Debug, Clone)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE_MAX] },
    Heap(Box<[u8]>),
}

impl Key {
    fn new(token: &str) -> Self {
        let b = token.as_bytes();
        match u8::try_from(b.len()) {
            Ok(len) if b.len() <= INLINE_MAX => {
                let mut bytes = [0u8; INLINE_MAX];
                bytes[..b.len()].copy_from_slice(b);
                Key::Inline { len, bytes }
            }
            _ => Key::Heap(b.into()),
        }
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Heap(b) => b,
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl Hash for Key {
    /// Hashes exactly as `[u8]` does, so maps keyed by `Key` can be searched by `&[u8]`.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

type Map = HashMap<Key, usize, FxBuildHasher>;

#[derive(Debug)]
enum Children {
    Small(Vec<(Key, usize)>),
    Map(Box<Map>),
}

impl Children {
    #[inline]
    fn get(&self, token: &str) -> Option<usize> {
        let token = token.as_bytes();
        match self {
            Children::Small(v) => v
                .iter()
                .find(|(k, _)| k.as_bytes() == token)
                .map(|&(_, i)| i),
            Children::Map(m) => m.get(token).copied(),
        }
    }

    fn insert(&mut self, token: &str, node: usize) {
        match self {
            Children::Small(v) if v.len() < SMALL_MAX => {
                if v.capacity() == 0 {
                    v.reserve_exact(1);
                }
                v.push((Key::new(token), node));
            }
            Children::Small(v) => {
                let mut m = Map::with_capacity_and_hasher(SMALL_MAX * 2, FxBuildHasher);
                m.extend(v.drain(..));
                m.insert(Key::new(token), node);
                *self = Children::Map(Box::new(m));
            }
            Children::Map(m) => {
                m.insert(Key::new(token), node);
            }
        }
    }

    fn remove(&mut self, token: &str) {
        match self {
            Children::Small(v) => {
                if let Some(at) = v.iter().position(|(k, _)| k.as_bytes() == token.as_bytes()) {
                    v.swap_remove(at);
                }
                if v.is_empty() {
                    *v = Vec::new();
                }
            }
            Children::Map(m) => {
                m.remove(token.as_bytes());
                if m.len() <= SMALL_MAX / 2 {
                    let mut v = Vec::with_capacity(m.len());
                    v.extend(m.drain());
                    *self = Children::Small(v);
                } else if m.capacity() > 64 && m.len() * 4 < m.capacity() {
                    m.shrink_to_fit();
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Children::Small(v) => v.is_empty(),
            Children::Map(m) => m.is_empty(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            Children::Small(v) => v.len(),
            Children::Map(m) => m.len(),
        }
    }
}

/// The wildcard slots of a node, boxed because most nodes have none.
#[derive(Debug)]
struct Wild<T> {
    one: usize,
    more: Option<Box<Subs<T>>>,
    zero: Option<Box<Subs<T>>>,
}

impl<T> Wild<T> {
    fn is_empty(&self) -> bool {
        self.one == NONE && self.more.is_none() && self.zero.is_none()
    }
}

#[derive(Debug)]
struct Node<T> {
    children: Children,
    subs: Option<Box<Subs<T>>>,
    wild: Option<Box<Wild<T>>>,
}

impl<T> Node<T> {
    fn new() -> Self {
        Node {
            children: Children::Small(Vec::new()),
            subs: None,
            wild: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.subs.is_none() && self.wild.is_none()
    }

    fn wild_mut(&mut self) -> &mut Wild<T> {
        self.wild.get_or_insert_with(|| {
            Box::new(Wild {
                one: NONE,
                more: None,
                zero: None,
            })
        })
    }
}

/// Hands a non-empty set of subscribers to `visit`.
#[inline]
fn report<T>(subs: &Option<Box<Subs<T>>>, visit: &mut impl FnMut(&[T], &[QueueGroup<T>])) {
    if let Some(s) = subs {
        visit(&s.plain, &s.queues);
    }
}

/// A subscription trie for one writer (see [`crate::SharedTrie`] for the concurrent one).
#[derive(Debug)]
pub struct Trie<T> {
    nodes: Slab<Node<T>>,
    root: usize,
    len: usize,
}

impl<T: Clone + PartialEq> Default for Trie<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone + PartialEq> Trie<T> {
    /// An empty trie.
    pub fn new() -> Self {
        let mut nodes = Slab::new();
        let root = nodes.insert(Node::new());
        Trie {
            nodes,
            root,
            len: 0,
        }
    }

    /// Number of subscriptions (each insert counts once, duplicates included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Does the trie hold no subscription?
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of nodes in the arena, the root included (for tests and memory figures).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The child of `parent` for `token`, created if missing.
    fn literal_child(&mut self, parent: usize, token: &str) -> Option<usize> {
        if let Some(c) = self.nodes.get(parent)?.children.get(token) {
            return Some(c);
        }
        let child = self.nodes.insert(Node::new());
        self.nodes.get_mut(parent)?.children.insert(token, child);
        Some(child)
    }

    /// The `*` child of `parent`, created if missing.
    fn one_child(&mut self, parent: usize) -> Option<usize> {
        let one = self
            .nodes
            .get(parent)?
            .wild
            .as_ref()
            .map_or(NONE, |w| w.one);
        if one != NONE {
            return Some(one);
        }
        let child = self.nodes.insert(Node::new());
        self.nodes.get_mut(parent)?.wild_mut().one = child;
        Some(child)
    }

    /// Adds a subscription of `value` to `pattern`, in queue group `queue` if given.
    pub fn insert(&mut self, pattern: &Pattern, queue: Option<&str>, value: T) {
        let mut at = self.root;
        for token in pattern.tokens() {
            let next = match token {
                PatternToken::Literal(l) => self.literal_child(at, l),
                PatternToken::One => self.one_child(at),
                PatternToken::OneOrMore | PatternToken::ZeroOrMore => {
                    let Some(node) = self.nodes.get_mut(at) else {
                        return;
                    };
                    let wild = node.wild_mut();
                    let slot = if *token == PatternToken::OneOrMore {
                        &mut wild.more
                    } else {
                        &mut wild.zero
                    };
                    slot.get_or_insert_with(Subs::new).insert(queue, value);
                    self.len += 1;
                    return;
                }
            };
            match next {
                Some(n) => at = n,
                None => return,
            }
        }
        if let Some(node) = self.nodes.get_mut(at) {
            node.subs.get_or_insert_with(Subs::new).insert(queue, value);
            self.len += 1;
        }
    }

    /// Removes one subscription of `value` to `pattern` in `queue`; returns whether there
    /// was one. Nodes left holding nothing are freed, up to the root.
    pub fn remove(&mut self, pattern: &Pattern, queue: Option<&str>, value: &T) -> bool {
        let tokens = pattern.tokens();
        // path[k] is the node reached after tokens[..=k]; its parent is path[k - 1] or root.
        let mut path: Vec<usize> = Vec::with_capacity(tokens.len());
        let mut at = self.root;
        let mut removed = false;
        for token in tokens {
            let Some(node) = self.nodes.get_mut(at) else {
                return false;
            };
            let next = match token {
                PatternToken::Literal(l) => node.children.get(l),
                PatternToken::One => node.wild.as_ref().map(|w| w.one).filter(|&o| o != NONE),
                PatternToken::OneOrMore | PatternToken::ZeroOrMore => {
                    if let Some(wild) = node.wild.as_mut() {
                        removed = if *token == PatternToken::OneOrMore {
                            remove_from(&mut wild.more, queue, value)
                        } else {
                            remove_from(&mut wild.zero, queue, value)
                        };
                        if wild.is_empty() {
                            node.wild = None;
                        }
                    }
                    break;
                }
            };
            match next {
                Some(n) => {
                    path.push(n);
                    at = n;
                }
                None => return false,
            }
        }
        if tokens.len() == path.len() {
            let Some(node) = self.nodes.get_mut(at) else {
                return false;
            };
            removed = remove_from(&mut node.subs, queue, value);
        }
        if !removed {
            return false;
        }
        self.len -= 1;
        self.prune(tokens, &path);
        true
    }

    /// Frees the empty tail of `path` (see [`Trie::remove`]) and unlinks it from its parent.
    fn prune(&mut self, tokens: &[PatternToken], path: &[usize]) {
        for k in (0..path.len()).rev() {
            let child = path[k];
            if !self.nodes.get(child).is_some_and(Node::is_empty) {
                return;
            }
            self.nodes.try_remove(child);
            let parent = if k == 0 { self.root } else { path[k - 1] };
            let Some(node) = self.nodes.get_mut(parent) else {
                return;
            };
            match &tokens[k] {
                PatternToken::Literal(l) => node.children.remove(l),
                _ => {
                    if let Some(wild) = node.wild.as_mut() {
                        wild.one = NONE;
                        if wild.is_empty() {
                            node.wild = None;
                        }
                    }
                }
            }
        }
    }

    /// Calls `visit` once per matching node that holds subscribers, with its plain
    /// subscribers and its queue groups. `subject` must be a valid native subject (an invalid
    /// one matches nothing sensible but is safe). Allocates nothing.
    pub fn for_each_match(&self, subject: &str, visit: &mut impl FnMut(&[T], &[QueueGroup<T>])) {
        if let Some(rest) = crate::inbox_rest(subject) {
            // An inbox is matched only by patterns naming its owner token literally:
            // no wildcard at the root or in place of the owner token.
            let Some(inbox) = self
                .nodes
                .get(self.root)
                .and_then(|root| root.children.get(crate::INBOX_TOKEN))
            else {
                return;
            };
            self.walk(inbox, rest, false, visit);
            return;
        }
        let system = subject.starts_with('$');
        self.walk(self.root, Some(subject), !system, visit);
    }

    /// Matches the `rest` of a subject (`None`: every token consumed) from node `at`.
    /// Loops along literal children and recurses only into `*` children, so the recursion
    /// depth is at most the number of `*` tokens in the deepest pattern.
    fn walk(
        &self,
        mut at: usize,
        mut rest: Option<&str>,
        mut wild_ok: bool,
        visit: &mut impl FnMut(&[T], &[QueueGroup<T>]),
    ) {
        loop {
            let Some(node) = self.nodes.get(at) else {
                return;
            };
            let Some(r) = rest else {
                report(&node.subs, visit);
                if wild_ok && let Some(w) = &node.wild {
                    report(&w.zero, visit);
                }
                return;
            };
            let (token, next) = match r.find('.') {
                Some(i) => (&r[..i], Some(&r[i + 1..])),
                None => (r, None),
            };
            if wild_ok && let Some(w) = &node.wild {
                report(&w.more, visit);
                report(&w.zero, visit);
                if w.one != NONE {
                    self.walk(w.one, next, true, visit);
                }
            }
            match node.children.get(token) {
                Some(c) => {
                    at = c;
                    rest = next;
                    wild_ok = true;
                }
                None => return,
            }
        }
    }

    /// Number of literal children of the root (for tests).
    #[cfg(test)]
    fn root_children(&self) -> usize {
        self.nodes.get(self.root).map_or(0, |n| n.children.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::parse_native(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn m(s: &str) -> Pattern {
        Pattern::parse_mqtt(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn matches(t: &Trie<u32>, subject: &str) -> Vec<u32> {
        let mut out = Vec::new();
        t.for_each_match(subject, &mut |plain, queues| {
            out.extend_from_slice(plain);
            for q in queues {
                out.extend(q.members.iter().map(|v| v + 1000));
            }
        });
        out.sort_unstable();
        out
    }

    #[test]
    fn literal_and_wildcards() {
        let mut t = Trie::new();
        t.insert(&p("foo.bar"), None, 1);
        t.insert(&p("foo.*"), None, 2);
        t.insert(&p("foo.>"), None, 3);
        t.insert(&p(">"), None, 4);
        t.insert(&m("foo/#"), None, 5);
        t.insert(&p("*.bar"), Some("q"), 6);
        t.insert(&p("*.bar"), Some("q"), 7);
        assert_eq!(t.len(), 7);
        assert_eq!(matches(&t, "foo.bar"), vec![1, 2, 3, 4, 5, 1006, 1007]);
        assert_eq!(matches(&t, "foo"), vec![4, 5]);
        assert_eq!(matches(&t, "foo.baz.x"), vec![3, 4, 5]);
        assert_eq!(matches(&t, "$SYS.bar"), Vec::<u32>::new());
        t.insert(&p("$SYS.>"), None, 8);
        assert_eq!(matches(&t, "$SYS.bar"), vec![8]);
    }

    #[test]
    fn inboxes_match_only_their_owner_token() {
        let mut t = Trie::new();
        for (i, s) in [
            ">",
            "*.>",
            "_INBOX.>",
            "_INBOX.*.x",
            "_INBOX.abc.*",
            "_INBOX.abc.>",
        ]
        .iter()
        .enumerate()
        {
            t.insert(&p(s), None, i as u32);
        }
        t.insert(&m("#"), None, 10);
        t.insert(&m("_INBOX/#"), None, 11);
        t.insert(&m("_INBOX/abc/#"), None, 12);
        t.insert(&p("*.abc.x"), None, 13);
        assert_eq!(matches(&t, "_INBOX.abc.x"), vec![4, 5, 12]);
        assert_eq!(matches(&t, "_INBOX.other.x"), Vec::<u32>::new());
        assert_eq!(matches(&t, "_INBOX"), Vec::<u32>::new());
        assert_eq!(matches(&t, "_INBOX.abc"), vec![12]);
        assert_eq!(matches(&t, "_INBOXES.abc.x"), vec![0, 1, 10, 13]);
    }

    #[test]
    fn remove_prunes() {
        let mut t = Trie::new();
        let pats = ["a.b.c", "a.*.c", "a.>", "a.b.c.d", "x", "a.b.*.>"];
        for (i, s) in pats.iter().enumerate() {
            t.insert(&p(s), None, i);
            t.insert(&p(s), Some("g"), i);
        }
        t.insert(&m("a/#"), None, 99);
        assert!(!t.remove(&p("a.b.c"), None, &7));
        assert!(!t.remove(&p("a.b.c"), Some("h"), &0));
        assert!(!t.remove(&p("nope.x"), None, &0));
        for (i, s) in pats.iter().enumerate() {
            assert!(t.remove(&p(s), None, &i), "{s}");
            assert!(t.remove(&p(s), Some("g"), &i), "{s}");
        }
        assert!(t.remove(&m("a/#"), None, &99));
        assert!(t.is_empty());
        assert_eq!(t.node_count(), 1);
        assert_eq!(t.root_children(), 0);
    }

    #[test]
    fn many_children_switch_to_map_and_back() {
        let mut t = Trie::new();
        for i in 0..100u32 {
            t.insert(&p(&format!("k.{i}")), None, i);
        }
        for i in 0..100u32 {
            assert_eq!(matches(&t, &format!("k.{i}")), vec![i]);
        }
        for i in 0..100u32 {
            assert!(t.remove(&p(&format!("k.{i}")), None, &i));
            if i < 99 {
                assert_eq!(matches(&t, "k.99"), vec![99]);
            }
        }
        assert_eq!(t.node_count(), 1);
    }

    #[test]
    fn long_tokens_and_sizes() {
        let long = "x".repeat(INLINE_MAX + 1);
        let mut t = Trie::new();
        t.insert(&p(&format!("{long}.a")), None, 1);
        t.insert(&p(&"y".repeat(INLINE_MAX)), None, 2);
        assert_eq!(matches(&t, &format!("{long}.a")), vec![1]);
        assert_eq!(matches(&t, &"y".repeat(INLINE_MAX)), vec![2]);
        assert_eq!(matches(&t, &"x".repeat(INLINE_MAX)), Vec::<u32>::new());
        assert_eq!(std::mem::size_of::<Key>(), 24);
        assert!(std::mem::size_of::<Node<u64>>() <= 40);
    }

    #[test]
    fn duplicates_count_and_remove_one_at_a_time() {
        let mut t = Trie::new();
        t.insert(&p("a"), None, 1);
        t.insert(&p("a"), None, 1);
        assert_eq!(matches(&t, "a"), vec![1, 1]);
        assert!(t.remove(&p("a"), None, &1));
        assert_eq!(matches(&t, "a"), vec![1]);
        assert_eq!(t.len(), 1);
    }
}
