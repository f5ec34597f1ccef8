//! Prefix-packed scoring: the rows of a trajectory in one forward pass over a token trie.
//!
//! In the `inline` rollout protocol (DESIGN.md §3: "one token stream per trajectory … one
//! forward/backward per trajectory") every row's prompt is a prefix of the trajectory's stream,
//! except Rehearse rows, which branch off it (a stream prefix, a private block, their
//! completion). Scoring each row on its own re-runs the shared prefix once per row,
//! `O(rows × length)` tokens. Here every row's full sequence (prompt + completion) is inserted
//! into a token trie — a node is a (parent node, token id) pair, so shared prefixes are stored
//! once — and the trie's nodes are run as one sequence of `L` tokens with a tree attention mask:
//! a token attends to exactly its ancestors and itself, at its depth as its position. Each
//! token therefore sees the same ids at the same positions as when its row is scored alone, and
//! its log-prob is the same up to float rounding ([`score_packed`] equals [`score`]).
//!
//! Rows are inserted longest first, so the longest row's tokens are nodes `0..T`: the *trunk*, a
//! chain whose ancestors are exactly the nodes before it (position = index). Trunk queries attend
//! causally to trunk keys only (a trunk node's ancestors are all trunk nodes, and no later node is
//! one), which takes the fast `is_causal` path of `scaled_dot_product_attention`; only the branch
//! queries `T..L` (Rehearse rows' private blocks and completions, typically short) use an
//! explicit `[L - T, L]` ancestor mask.
//!
//! Cost: `L` tokens through the weights instead of `Σ rows` (or `rows × longest` padded);
//! attention is causal over the trunk plus `(L - T) × L` masked scores per head for the branches,
//! and the branch mask is `(L - T) × L` bytes. Keep packs to a few thousand tokens
//! ([`pack_groups`]).

use std::collections::HashMap;
use std::ops::Range;

use tch::{Device, Tensor};

use crate::checkpoint::{LayerTape, Plan};
use crate::error::{Error, Result};
use crate::model::{Layer, Model};
use crate::scoring::{target_logprobs, validate, ScoreRow, ScoredBatch};

/// Parent key of a trie node at depth 0.
const ROOT: u32 = u32::MAX;

/// A token trie under construction: nodes in insertion order, so a parent always comes before
/// its children.
#[derive(Debug, Default)]
struct Trie {
    /// `(parent node or ROOT, token id) → node`.
    children: HashMap<(u32, u32), u32>,
    ids: Vec<u32>,
    parent: Vec<Option<u32>>,
    positions: Vec<i64>,
}

impl Trie {
    fn len(&self) -> usize {
        self.ids.len()
    }

    /// How many nodes inserting `seq` would add: the tokens past its longest stored prefix.
    fn new_nodes(&self, seq: &[u32]) -> usize {
        let mut at = ROOT;
        for (depth, &tok) in seq.iter().enumerate() {
            match self.children.get(&(at, tok)) {
                Some(&node) => at = node,
                None => return seq.len() - depth,
            }
        }
        0
    }

    /// Inserts `seq` and returns the node of each of its tokens.
    fn insert(&mut self, seq: &[u32]) -> Vec<u32> {
        let mut at = ROOT;
        let mut nodes = Vec::with_capacity(seq.len());
        for (depth, &tok) in seq.iter().enumerate() {
            let next = self.ids.len() as u32;
            let node = *self.children.entry((at, tok)).or_insert(next);
            if node == next {
                self.ids.push(tok);
                self.parent.push((at != ROOT).then_some(at));
                self.positions.push(depth as i64);
            }
            nodes.push(node);
            at = node;
        }
        nodes
    }
}

/// The full sequence of a row, prompt then completion.
fn sequence(row: &ScoreRow) -> Vec<u32> {
    let mut seq = Vec::with_capacity(row.len());
    seq.extend_from_slice(&row.prompt_ids);
    seq.extend_from_slice(&row.completion_ids);
    seq
}

/// Rows packed into one token trie, laid out as one sequence of `L` tokens (the trie's nodes in
/// insertion order: a node's parent always has a smaller index). Rows are inserted longest first
/// (ties in the caller's order), so nodes `0..T` are the longest row (the trunk,
/// [`trunk_len`](Self::trunk_len)); every per-row accessor still takes the caller's row index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedRows {
    ids: Vec<u32>,
    positions: Vec<i64>,
    parent: Vec<Option<u32>>,
    /// Per row, in the caller's order, the packed index of each completion token.
    completion: Vec<Vec<u32>>,
    /// `T`: the longest row's length; nodes `0..T` are its tokens, in order.
    trunk: usize,
}

impl PackedRows {
    /// Packs `rows` (each row's prompt followed by its completion) into a trie; rows that share a
    /// prefix share its tokens.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a row with an empty prompt or completion (a completion token
    /// needs a token before it to be predicted).
    pub fn new(rows: &[ScoreRow]) -> Result<Self> {
        for (i, row) in rows.iter().enumerate() {
            if row.prompt_ids.is_empty() || row.completion_ids.is_empty() {
                return Err(Error::InvalidRequest(format!(
                    "score row {i}: prompt and completion must be non-empty"
                )));
            }
        }
        // Longest first (stable): the first row inserted lays its tokens out as nodes 0..T.
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(rows[i].len()));
        let mut trie = Trie::default();
        let mut completion = vec![Vec::new(); rows.len()];
        for &i in &order {
            let row = &rows[i];
            let nodes = trie.insert(&sequence(row));
            completion[i] = nodes[row.prompt_ids.len()..].to_vec();
        }
        let trunk = order.first().map_or(0, |&i| rows[i].len());
        Ok(Self {
            ids: trie.ids,
            positions: trie.positions,
            parent: trie.parent,
            completion,
            trunk,
        })
    }

    /// `T`, the trunk's length: nodes `0..T` are the longest row's tokens in order (node `i` at
    /// position `i`, its ancestors exactly the nodes before it); nodes `T..L` are branches.
    pub fn trunk_len(&self) -> usize {
        self.trunk
    }

    /// Packed length `L`, tokens: the distinct (prefix, token) nodes of all rows.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when no row was packed.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// `[L]` token id of each packed token.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// `[L]` position of each packed token: its depth in the trie, which is its index in every
    /// row that contains it.
    pub fn positions(&self) -> &[i64] {
        &self.positions
    }

    /// `[L]` packed index of each token's predecessor (`None` at position 0); always smaller than
    /// the token's own index.
    pub fn parents(&self) -> &[Option<u32>] {
        &self.parent
    }

    /// Number of packed rows.
    pub fn rows(&self) -> usize {
        self.completion.len()
    }

    /// Packed index of each completion token of row `row`.
    ///
    /// # Panics
    /// When `row >= self.rows()`.
    pub fn completion_nodes(&self, row: usize) -> &[u32] {
        &self.completion[row]
    }

    /// Packed index of the token whose hidden state predicts each completion token of row `row`
    /// (the completion token's parent).
    ///
    /// # Panics
    /// When `row >= self.rows()`.
    pub fn predictor_nodes(&self, row: usize) -> Vec<u32> {
        self.completion[row]
            .iter()
            .map(|&n| self.parent[n as usize].unwrap_or(0))
            .collect()
    }

    /// The tree attention mask, row-major `[L, L]`: entry `(j, i)` is true when key `i` is an
    /// ancestor of query `j` or `j` itself. Row `j` is its parent's row plus `j`, so building it
    /// costs the sum of the depths, not `L²` (beyond zeroing).
    pub fn mask(&self) -> Vec<bool> {
        self.mask_rows(0)
    }

    /// Rows `T..L` of [`mask`](Self::mask), row-major `[L - T, L]`: the ancestor mask of the
    /// branch queries (the trunk's rows are causal).
    pub fn branch_mask(&self) -> Vec<bool> {
        self.mask_rows(self.trunk)
    }

    /// Rows `start..L` of the mask, `start` 0 or `T` (a parent before `start` is then a trunk
    /// node, whose row is true exactly up to itself).
    fn mask_rows(&self, start: usize) -> Vec<bool> {
        let l = self.len();
        let mut mask = vec![false; (l - start) * l];
        for j in start..l {
            let r = (j - start) * l;
            if let Some(p) = self.parent[j] {
                // The parent's row is false past column p.
                let p = p as usize;
                if p >= start {
                    let pr = (p - start) * l;
                    mask.copy_within(pr..pr + p + 1, r);
                } else {
                    mask[r..=r + p].fill(true);
                }
            }
            mask[r + j] = true;
        }
        mask
    }

    /// The branch segments: maximal runs of nodes `T..L` in which each node's parent is the
    /// node before it (a row's new tokens, inserted together), each with the packed indices of
    /// the ancestors of its first node, root first (as many as its first node's position).
    pub fn segments(&self) -> Vec<Segment> {
        let mut out: Vec<Segment> = Vec::new();
        for j in self.trunk..self.len() {
            let continues = j > self.trunk && self.parent[j] == Some(j as u32 - 1);
            match out.last_mut() {
                Some(seg) if continues => seg.len += 1,
                _ => {
                    let mut ancestors = Vec::with_capacity(self.positions[j] as usize);
                    let mut at = self.parent[j];
                    while let Some(p) = at {
                        ancestors.push(i64::from(p));
                        at = self.parent[p as usize];
                    }
                    ancestors.reverse();
                    out.push(Segment {
                        start: j,
                        len: 1,
                        ancestors,
                    });
                }
            }
        }
        out
    }

    /// The inputs of [`Model::forward_hidden_packed`] on `device`: ids `[1, L]` i64, positions
    /// `[1, L]` i64 and the attention layout (the trunk and the branch segments with their
    /// ancestors).
    pub fn inputs(&self, device: Device) -> (Tensor, Tensor, PackedLayout) {
        let l = self.len() as i64;
        let ids: Vec<i64> = self.ids.iter().map(|&t| i64::from(t)).collect();
        let ids = Tensor::from_slice(&ids).view([1, l]).to_device(device);
        let positions = Tensor::from_slice(&self.positions)
            .view([1, l])
            .to_device(device);
        let segments = self
            .segments()
            .into_iter()
            .map(|s| {
                let (n, p) = (s.len as i64, s.ancestors.len() as i64);
                SegmentInputs {
                    start: s.start as i64,
                    len: n,
                    ancestors: Tensor::from_slice(&s.ancestors).to_device(device),
                    // Query i sees every ancestor and the segment's nodes up to itself. A
                    // segment without ancestors (another trajectory's root) is plain causal.
                    mask: (p > 0)
                        .then(|| Tensor::ones([n, p + n], (tch::Kind::Bool, device)).tril(p)),
                }
            })
            .collect();
        let layout = PackedLayout {
            trunk: self.trunk,
            segments,
        };
        (ids, positions, layout)
    }
}

/// A run of branch nodes `start..start + len` whose every node's parent is the node before it;
/// the first node's ancestors are `ancestors` (packed indices, root first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub start: usize,
    pub len: usize,
    pub ancestors: Vec<i64>,
}

/// How a packed sequence attends: the trunk `0..T` causally, each branch segment to its
/// ancestors and itself ([`PackedRows::inputs`]).
#[derive(Debug)]
pub struct PackedLayout {
    /// `T`: nodes `0..T` are a chain at positions `0..T`.
    pub trunk: usize,
    /// The branch segments, in node order, covering `T..L`.
    pub segments: Vec<SegmentInputs>,
}

/// One branch segment on the device.
#[derive(Debug)]
pub struct SegmentInputs {
    /// First node and node count.
    pub start: i64,
    pub len: i64,
    /// `[p]` i64 packed indices of the first node's ancestors.
    pub ancestors: Tensor,
    /// `[len, p + len]` bool: causal over the segment, after every ancestor; `None` when the
    /// segment has no ancestors (`p = 0`), which then takes the `is_causal` path.
    pub mask: Option<Tensor>,
}

/// Packed length, tokens, of `rows` in one trie (rows with an empty prompt or completion count
/// like any other).
pub fn packed_len(rows: &[ScoreRow]) -> usize {
    let mut trie = Trie::default();
    for row in rows {
        trie.insert(&sequence(row));
    }
    trie.len()
}

/// Splits `rows` into consecutive groups whose packed length ([`PackedRows::len`], distinct trie
/// tokens) stays within `max_tokens` (a row longer than that gets a group of its own): the
/// packed analogue of [`crate::scoring::micro_batches`]. Only consecutive rows share a group, so
/// keep a trajectory's rows together to share their prefix. The budget is linear in tokens, but
/// a group's attention mask is `L²` bytes and its attention `L²` scores per head.
pub fn pack_groups(rows: &[ScoreRow], max_tokens: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut trie = Trie::default();
    for (i, row) in rows.iter().enumerate() {
        let seq = sequence(row);
        if i > start && trie.len() + trie.new_nodes(&seq) > max_tokens {
            out.push(start..i);
            start = i;
            trie = Trie::default();
        }
        trie.insert(&seq);
    }
    if start < rows.len() {
        out.push(start..rows.len());
    }
    out
}

impl Model {
    /// Tree-attention forward of a packed sequence: `ids, positions: [1, L]` i64 and the layout
    /// ([`PackedRows::inputs`]) → final hidden states `[1, L, hidden]` (model dtype). Records
    /// autograd unless called under `tch::no_grad`.
    ///
    /// Per layer, trunk queries `0..T` attend causally to trunk keys (exact: a trunk node's
    /// ancestors are all trunk nodes), the fast `is_causal` path. Each branch segment's queries
    /// attend to its ancestors' keys (gathered) followed by its own keys, causally: a segment
    /// of `n` nodes whose first node has `p` ancestors costs `n × (p + n)` scores, not
    /// `n × L`, so several trajectories (or a seed's Rehearse rows) in one pack cost what their
    /// rows cost, without the quadratic penalty of a whole-pack mask.
    ///
    /// On the CPU, grouped key/value heads go to attention as they are (`enable_gqa`); on other
    /// devices they are repeated to the query heads, since the fused GPU kernels that take an
    /// arbitrary mask reject grouped heads.
    pub fn forward_hidden_packed(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        layout: &PackedLayout,
    ) -> Tensor {
        let (cos, sin) = self.rope.tables(positions);
        let mut x = Tensor::embedding(&self.embed, ids, -1, false, false);
        for layer in &self.layers {
            x = self.packed_layer(layer, &x, &cos, &sin, layout);
        }
        self.final_norm(&x)
    }

    /// One decoder layer of [`Model::forward_hidden_packed`]: `x: [1, L, hidden]` → same shape.
    pub(crate) fn packed_layer(
        &self,
        layer: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        layout: &PackedLayout,
    ) -> Tensor {
        let c = self.config();
        let group = (c.num_attention_heads / c.num_key_value_heads) as i64;
        let gqa = group > 1 && self.device() == Device::Cpu;
        let l = x.size()[1];
        let t = (layout.trunk as i64).min(l);
        let (q, k, v) = self.attention_inputs(layer, x, cos, sin);
        let (k, v) = if group > 1 && !gqa {
            (
                k.repeat_interleave_self_int(group, 1, None),
                v.repeat_interleave_self_int(group, 1, None),
            )
        } else {
            (k, v)
        };
        let mut parts = Vec::with_capacity(layout.segments.len() + 1);
        if t > 0 {
            parts.push(Tensor::scaled_dot_product_attention::<Tensor>(
                &q.narrow(2, 0, t),
                &k.narrow(2, 0, t),
                &v.narrow(2, 0, t),
                None,
                0.0,
                true,
                None,
                gqa,
            ));
        }
        for seg in &layout.segments {
            let Some(mask) = &seg.mask else {
                // A root segment (another trajectory in the pack): causal over itself, the
                // fast path, instead of an explicit `[n, n]` mask whose attention CPU SDPA
                // runs at half the speed and with `n²` scores per head kept for backward.
                parts.push(Tensor::scaled_dot_product_attention::<Tensor>(
                    &q.narrow(2, seg.start, seg.len),
                    &k.narrow(2, seg.start, seg.len),
                    &v.narrow(2, seg.start, seg.len),
                    None,
                    0.0,
                    true,
                    None,
                    gqa,
                ));
                continue;
            };
            let keys = |kv: &Tensor| {
                Tensor::cat(
                    &[
                        kv.index_select(2, &seg.ancestors),
                        kv.narrow(2, seg.start, seg.len),
                    ],
                    2,
                )
            };
            parts.push(Tensor::scaled_dot_product_attention(
                &q.narrow(2, seg.start, seg.len),
                &keys(&k),
                &keys(&v),
                Some(mask),
                0.0,
                false,
                None,
                gqa,
            ));
        }
        let attn = if parts.len() == 1 {
            parts.remove(0)
        } else {
            Tensor::cat(&parts, 2)
        };
        self.layer_output(layer, x, &attn)
    }
}

/// Scores `rows` like [`score`](crate::scoring::score) — same checks, same errors, same output:
/// `[rows, longest completion]` f32 `log softmax(logits / temperature)` of each completion token,
/// padding 0, and the mask — from ONE tree-masked forward of all rows packed into a trie
/// ([`PackedRows`]). Autograd is recorded unless under `tch::no_grad`. Only the hidden states
/// that predict completion tokens go through the vocabulary projection (in chunks), once per
/// distinct packed token.
///
/// # Errors
/// As [`score`](crate::scoring::score): [`Error::InvalidRequest`] for no rows, an empty prompt or
/// completion, an id outside the vocabulary or a non-positive temperature;
/// [`Error::ContextOverflow`] for a row longer than the context.
pub fn score_packed(model: &Model, rows: &[ScoreRow], temperature: f64) -> Result<ScoredBatch> {
    score_packed_counted(model, rows, temperature, false).map(|(batch, _, _)| batch)
}

/// [`score_packed`], also returning the packed length `L` (tokens run through the model) and,
/// with `checkpoint`, the tape that completes the backward pass ([`LayerTape::backward`]).
pub(crate) fn score_packed_counted<'m>(
    model: &'m Model,
    rows: &[ScoreRow],
    temperature: f64,
    checkpoint: bool,
) -> Result<(ScoredBatch, usize, Option<LayerTape<'m>>)> {
    validate(model, rows, temperature)?;
    let pack = PackedRows::new(rows)?;
    let device = model.device();
    let (ids, positions, layout) = pack.inputs(device);
    let (hidden, mut tape) = if checkpoint {
        let (hidden, tape) = model.forward_checkpointed(&ids, &positions, Plan::Packed(layout));
        (hidden, Some(tape))
    } else {
        (model.forward_hidden_packed(&ids, &positions, &layout), None)
    };
    let hidden = hidden.squeeze_dim(0);

    // A completion node is one (predictor, token) pair: rows that share it share its log-prob,
    // so each is projected once.
    let mut slot = vec![u32::MAX; pack.len()];
    let (mut predictors, mut targets) = (Vec::new(), Vec::new());
    for row in &pack.completion {
        for &node in row {
            let n = node as usize;
            if slot[n] == u32::MAX {
                slot[n] = predictors.len() as u32;
                predictors.push(i64::from(pack.parent[n].unwrap_or(0)));
                targets.push(i64::from(pack.ids[n]));
            }
        }
    }
    let selected = hidden.index_select(0, &Tensor::from_slice(&predictors).to_device(device));
    let targets = Tensor::from_slice(&targets).to_device(device);
    let picked = target_logprobs(model, &selected, &targets, temperature, tape.as_mut()).view([-1]);

    let b = rows.len();
    let width = rows
        .iter()
        .map(|r| r.completion_ids.len())
        .max()
        .unwrap_or(1);
    let mut layout = vec![0i64; b * width];
    let mut valid = vec![0f32; b * width];
    for (i, row) in pack.completion.iter().enumerate() {
        for (j, &node) in row.iter().enumerate() {
            layout[i * width + j] = i64::from(slot[node as usize]);
            valid[i * width + j] = 1.0;
        }
    }
    let (b, width) = (b as i64, width as i64);
    let mask = Tensor::from_slice(&valid)
        .view([b, width])
        .to_device(device);
    let layout = Tensor::from_slice(&layout).to_device(device);
    let logprobs = picked.index_select(0, &layout).view([b, width]) * &mask;
    Ok((ScoredBatch { logprobs, mask }, pack.len(), tape))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::grpo::GrpoConfig;
    use crate::learner::{Learner, LearnerConfig, TrainRow};
    use crate::scoring::{score, score_no_grad};
    use tch::Kind;

    fn tiny(seed: u64) -> Model {
        Model::random(&ModelConfig::tiny(), seed, Device::Cpu, Kind::Float).unwrap()
    }

    fn row(prompt: &[u32], completion: &[u32]) -> ScoreRow {
        ScoreRow {
            prompt_ids: prompt.to_vec(),
            completion_ids: completion.to_vec(),
        }
    }

    /// `n` pseudo-random ids in `[10, 3010)`, different for each `k`.
    fn ids(n: usize, k: u32) -> Vec<u32> {
        (0..n as u32)
            .map(|t| 10 + (t * 31 + k * 97 + t * t * 7) % 3000)
            .collect()
    }

    fn cat(parts: &[&[u32]]) -> Vec<u32> {
        parts.concat()
    }

    /// One inline trajectory: three Act rows that extend one stream (system + observation →
    /// act, …) and two Rehearse rows that branch off it with private blocks.
    fn trajectory(k: u32) -> Vec<ScoreRow> {
        let (sys, o1, a1, o2, a2, o3, a3) = (
            ids(12, k),
            ids(5, k + 1),
            ids(4, k + 2),
            ids(6, k + 3),
            ids(3, k + 4),
            ids(4, k + 5),
            ids(5, k + 6),
        );
        let (f1, r1, f2, r2) = (ids(7, k + 7), ids(3, k + 8), ids(2, k + 9), ids(6, k + 10));
        vec![
            row(&cat(&[&sys, &o1]), &a1),
            row(&cat(&[&sys, &o1, &a1, &o2]), &a2),
            row(&cat(&[&sys, &o1, &a1, &o2, &a2, &o3]), &a3),
            row(&cat(&[&sys, &o1, &f1]), &r1),
            row(&cat(&[&sys, &o1, &a1, &o2, &f2]), &r2),
        ]
    }

    fn row_logprobs(batch: &ScoredBatch, i: usize, n: usize) -> Vec<f32> {
        Vec::<f32>::try_from(&batch.logprobs.get(i as i64).narrow(0, 0, n as i64)).unwrap()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// Shared prefixes are stored once, branches get their own nodes (even for a token id seen
    /// elsewhere), and the mask is exactly ancestor-or-self.
    #[test]
    fn trie_stores_shared_prefixes_once() {
        let rows = [
            row(&[1, 2, 9], &[4]),
            row(&[1, 2, 3], &[4, 5]),
            // The longest row, inserted first: its tokens are nodes 0..7, the trunk.
            row(&[1, 2, 3, 4, 5, 6], &[7]),
            // A duplicate adds nothing.
            row(&[1, 2, 3], &[4, 5]),
        ];
        let pack = PackedRows::new(&rows).unwrap();
        assert_eq!(pack.len(), 9);
        assert_eq!(packed_len(&rows), 9);
        assert_eq!(pack.trunk_len(), 7);
        assert_eq!(pack.ids(), [1, 2, 3, 4, 5, 6, 7, 9, 4]);
        assert_eq!(pack.positions(), [0, 1, 2, 3, 4, 5, 6, 2, 3]);
        let parents: Vec<Option<u32>> = [None, Some(0), Some(1), Some(2), Some(3), Some(4)]
            .into_iter()
            .chain([Some(5), Some(1), Some(7)])
            .collect();
        assert_eq!(pack.parents(), parents.as_slice());
        // Per-row results keep the caller's row order.
        assert_eq!(pack.rows(), 4);
        assert_eq!(pack.completion_nodes(0), [8]);
        assert_eq!(pack.predictor_nodes(0), [7]);
        assert_eq!(pack.completion_nodes(1), [3, 4]);
        assert_eq!(pack.predictor_nodes(1), [2, 3]);
        assert_eq!(pack.completion_nodes(2), [6]);
        assert_eq!(pack.predictor_nodes(2), [5]);
        assert_eq!(pack.completion_nodes(3), [3, 4]);

        let mask = pack.mask();
        let l = pack.len();
        let row_of = |j: usize| -> Vec<usize> { (0..l).filter(|&i| mask[j * l + i]).collect() };
        assert_eq!(row_of(0), [0]);
        assert_eq!(row_of(6), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(row_of(7), [0, 1, 7]);
        assert_eq!(row_of(8), [0, 1, 7, 8]);
        // Every row is the ancestor chain, walked by hand.
        for j in 0..l {
            let mut chain = vec![j];
            let mut at = j;
            while let Some(p) = pack.parents()[at] {
                at = p as usize;
                chain.push(at);
            }
            chain.sort_unstable();
            assert_eq!(row_of(j), chain, "mask row {j}");
        }
        // The trunk's rows are causal; the branch mask is the rest.
        for j in 0..pack.trunk_len() {
            assert_eq!(row_of(j), (0..=j).collect::<Vec<_>>(), "trunk row {j}");
        }
        assert_eq!(pack.branch_mask(), mask[pack.trunk_len() * l..]);
        let (ids, positions, layout) = pack.inputs(Device::Cpu);
        assert_eq!(ids.size(), [1, 9]);
        assert_eq!(positions.size(), [1, 9]);
        // One branch segment, nodes 7 and 8, off the trunk after nodes 0 and 1: its mask is
        // the branch rows of the tree mask restricted to ancestors and itself.
        assert_eq!(
            pack.segments(),
            [Segment {
                start: 7,
                len: 2,
                ancestors: vec![0, 1]
            }]
        );
        let mask = layout.segments[0]
            .mask
            .as_ref()
            .expect("a segment with ancestors");
        assert_eq!(mask.size(), [2, 4]);
        assert_eq!(mask.kind(), Kind::Bool);
        assert_eq!(mask.sum(Kind::Int64).int64_value(&[]), 3 + 4);

        assert!(PackedRows::new(&[row(&[], &[1])]).is_err());
    }

    /// The packed log-probs of an inline trajectory (3 Act rows on one stream, 2 Rehearse rows
    /// branching off it) equal per-row scoring, at a temperature other than 1.
    #[test]
    fn packed_logprobs_equal_per_row_scores() {
        let model = tiny(21);
        let rows = trajectory(0);
        let total: usize = rows.iter().map(ScoreRow::len).sum();
        let packed = PackedRows::new(&rows).unwrap().len();
        // sys+o1+a1+o2+a2+o3+a3 = 39, f1+r1 = 10, f2+r2 = 8.
        assert_eq!(packed, 57);
        assert!(packed < total, "{packed} vs {total}");

        let (batch, l, _) =
            tch::no_grad(|| score_packed_counted(&model, &rows, 0.7, false)).unwrap();
        assert_eq!(l, packed);
        let width = rows.iter().map(|r| r.completion_ids.len()).max().unwrap();
        assert_eq!(batch.logprobs.size(), [5, width as i64]);
        assert_eq!(batch.logprobs.kind(), Kind::Float);
        let padded = tch::no_grad(|| score(&model, &rows, 0.7)).unwrap();
        assert_eq!(
            Vec::<f32>::try_from(&batch.mask.view([-1])).unwrap(),
            Vec::<f32>::try_from(&padded.mask.view([-1])).unwrap()
        );
        for (i, r) in rows.iter().enumerate() {
            let n = r.completion_ids.len();
            let alone = tch::no_grad(|| score(&model, std::slice::from_ref(r), 0.7)).unwrap();
            let ours = row_logprobs(&batch, i, n);
            let diff = max_diff(&ours, &row_logprobs(&alone, 0, n));
            assert!(diff < 1e-4, "row {i}: max diff {diff}");
            assert!(ours.iter().all(|&x| x < 0.0 && x > -20.0), "{ours:?}");
            if n < width {
                assert_eq!(
                    batch.logprobs.double_value(&[i as i64, width as i64 - 1]),
                    0.0
                );
            }
        }
    }

    /// A row's log-probs do not depend on the branches packed with it: the same Act row beside
    /// two Rehearse rows with different private blocks (different lengths) scores identically,
    /// and as when scored alone.
    #[test]
    fn branches_do_not_leak_into_other_rows() {
        let model = tiny(22);
        let (p, obs, act) = (ids(9, 1), ids(4, 2), ids(6, 3));
        let (f1, f2, c) = (ids(5, 4), ids(8, 5), ids(3, 6));
        let a = row(&cat(&[&p, &obs]), &act);
        let b1 = row(&cat(&[&p, &f1, &obs]), &c);
        let b2 = row(&cat(&[&p, &f2, &obs]), &c);
        let n = act.len();
        let with = |other: &ScoreRow| {
            let batch =
                tch::no_grad(|| score_packed(&model, &[a.clone(), other.clone()], 1.0)).unwrap();
            row_logprobs(&batch, 0, n)
        };
        let (in1, in2) = (with(&b1), with(&b2));
        let packed_alone = row_logprobs(
            &tch::no_grad(|| score_packed(&model, std::slice::from_ref(&a), 1.0)).unwrap(),
            0,
            n,
        );
        let alone = row_logprobs(
            &tch::no_grad(|| score(&model, std::slice::from_ref(&a), 1.0)).unwrap(),
            0,
            n,
        );
        assert!(max_diff(&in1, &in2) < 1e-6, "{in1:?} vs {in2:?}");
        assert!(
            max_diff(&in1, &packed_alone) < 1e-6,
            "{in1:?} vs {packed_alone:?}"
        );
        assert!(max_diff(&in1, &alone) < 1e-4, "{in1:?} vs {alone:?}");
        // The branch rows themselves see different contexts, so their scores differ.
        let b = |other: &ScoreRow| {
            let batch =
                tch::no_grad(|| score_packed(&model, &[a.clone(), other.clone()], 1.0)).unwrap();
            row_logprobs(&batch, 1, c.len())
        };
        assert!(max_diff(&b(&b1), &b(&b2)) > 1e-4);
    }

    /// The old single-pass forward: every query through the full `[1, 1, L, L]` mask.
    fn forward_full_mask(model: &Model, pack: &PackedRows) -> Tensor {
        let (ids, positions, _) = pack.inputs(Device::Cpu);
        let l = pack.len() as i64;
        let mask = Tensor::from_slice(&pack.mask()).view([1, 1, l, l]);
        let c = model.config();
        let group = (c.num_attention_heads / c.num_key_value_heads) as i64;
        let (cos, sin) = model.rope.tables(&positions);
        let mut x = Tensor::embedding(&model.embed, &ids, -1, false, false);
        for layer in &model.layers {
            let (q, k, v) = model.attention_inputs(layer, &x, &cos, &sin);
            let k = k.repeat_interleave_self_int(group, 1, None);
            let v = v.repeat_interleave_self_int(group, 1, None);
            let attn = Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                Some(&mask),
                0.0,
                false,
                None,
                false,
            );
            x = model.layer_output(layer, &x, &attn);
        }
        model.final_norm(&x)
    }

    /// The longest row is the trunk (nodes `0..T`, a chain at positions `0..T`) wherever it sits
    /// among the rows, and the split forward (causal trunk + masked branches) gives the hidden
    /// states of the full-mask forward; a lone row (`T == L`) gives those of `forward_hidden`.
    #[test]
    fn trunk_is_the_longest_row_and_split_attention_is_exact() {
        let model = tiny(25);
        let mut rows = trajectory(3);
        // Put the longest row (Act 3, 39 tokens) last.
        let longest = rows.remove(2);
        rows.push(longest.clone());
        let pack = PackedRows::new(&rows).unwrap();
        let t = pack.trunk_len();
        assert_eq!(t, longest.len());
        assert_eq!(t, rows.iter().map(ScoreRow::len).max().unwrap());
        assert!(t < pack.len());
        assert_eq!(pack.ids()[..t], sequence(&longest));
        assert_eq!(pack.positions()[..t], (0..t as i64).collect::<Vec<_>>());
        for (i, p) in pack.parents()[..t].iter().enumerate() {
            assert_eq!(*p, i.checked_sub(1).map(|p| p as u32));
        }
        assert!(pack.parents()[t..].iter().all(|p| p.is_some()));
        // The longest row's completion is the trunk's tail.
        let n = longest.completion_ids.len();
        assert_eq!(
            pack.completion_nodes(rows.len() - 1),
            (t - n..t).map(|i| i as u32).collect::<Vec<_>>()
        );

        let (ids, positions, layout) = pack.inputs(Device::Cpu);
        // Every branch node is in exactly one segment, and a segment's first node has as many
        // ancestors as its position.
        let segs = pack.segments();
        assert_eq!(segs.iter().map(|s| s.len).sum::<usize>(), pack.len() - t);
        for seg in &segs {
            assert_eq!(seg.ancestors.len() as i64, pack.positions()[seg.start]);
        }
        let split = tch::no_grad(|| model.forward_hidden_packed(&ids, &positions, &layout));
        let full = tch::no_grad(|| forward_full_mask(&model, &pack));
        assert_eq!(split.size(), full.size());
        let diff = (&split - &full).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "split vs full mask: {diff}");

        // Two trajectories in one pack (the warm-up packs two seeds per step): the second's
        // longest row is a root segment without ancestors, run causally without a mask, and the
        // hidden states still equal the full-mask forward's.
        let mut two = rows.clone();
        two.extend(trajectory(40));
        let pack2 = PackedRows::new(&two).unwrap();
        let (ids2, positions2, layout2) = pack2.inputs(Device::Cpu);
        let roots: Vec<_> = layout2
            .segments
            .iter()
            .filter(|s| s.mask.is_none())
            .collect();
        assert_eq!(
            roots.len(),
            1,
            "one root segment: the other trajectory's trunk"
        );
        assert_eq!(roots[0].len as usize, trajectory(40)[2].len());
        let split = tch::no_grad(|| model.forward_hidden_packed(&ids2, &positions2, &layout2));
        let full = tch::no_grad(|| forward_full_mask(&model, &pack2));
        let diff = (&split - &full).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "two trajectories, split vs full mask: {diff}");

        let alone = PackedRows::new(std::slice::from_ref(&longest)).unwrap();
        assert_eq!(alone.trunk_len(), alone.len());
        let (ids, positions, layout) = alone.inputs(Device::Cpu);
        assert!(layout.segments.is_empty());
        let packed = tch::no_grad(|| model.forward_hidden_packed(&ids, &positions, &layout));
        let plain = tch::no_grad(|| model.forward_hidden(&ids));
        let diff = (&packed - &plain).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "lone row vs forward_hidden: {diff}");
    }

    #[test]
    fn pack_groups_respect_the_packed_budget() {
        let rows = [
            row(&[1, 2, 3], &[4]),          // 4 new → 4
            row(&[1, 2, 3, 4], &[5, 6]),    // 2 new → 6
            row(&[1, 2, 7], &[8]),          // 2 new → 8
            row(&[9, 9, 9, 9, 9], &[9, 9]), // 7 new → 15 > 10: new group of 7
            row(&[9, 9, 9, 9, 9], &[9, 1]), // 1 new → 8
            row(&[5; 20], &[6]),            // 21 new: alone, over budget
            row(&[1], &[2]),                // 2
        ];
        assert_eq!(pack_groups(&rows, 10), vec![0..3, 3..5, 5..6, 6..7]);
        for range in pack_groups(&rows, 10) {
            let len = packed_len(&rows[range.clone()]);
            assert!(len <= 10 || range.len() == 1, "{range:?}: {len}");
        }
        assert_eq!(packed_len(&rows[0..3]), 8);
        assert_eq!(pack_groups(&rows, 8), vec![0..3, 3..5, 5..6, 6..7]);
        // At 7 the second trajectory-like pair no longer fits together (7 + 1 > 7).
        assert_eq!(
            pack_groups(&rows, 7),
            vec![0..2, 2..3, 3..4, 4..5, 5..6, 6..7]
        );
        assert_eq!(pack_groups(&rows, 1000), vec![0..7]);
        assert!(pack_groups(&[], 10).is_empty());
    }

    #[test]
    fn packed_scoring_rejects_what_scoring_rejects() {
        let model = tiny(1);
        let err = |rows: &[ScoreRow], t: f64| {
            let a = score_packed(&model, rows, t).unwrap_err().to_string();
            let b = score(&model, rows, t).unwrap_err().to_string();
            assert_eq!(a, b);
            a
        };
        assert!(err(&[row(&[], &[1])], 1.0).contains("non-empty"));
        assert!(err(&[row(&[1], &[])], 1.0).contains("non-empty"));
        assert!(err(&[row(&[1], &[49_152])], 1.0).contains("outside the vocabulary"));
        assert!(err(&[row(&[1], &[2])], 0.0).contains("temperature"));
        assert!(err(&[], 1.0).contains("no rows"));
        assert!(err(&[row(&[1; 2048], &[2])], 1.0).contains("2048"));
    }

    /// Two trajectories of GRPO rows with old log-probs near the model's own and advantages of
    /// both signs.
    fn train_rows(model: &Model) -> Vec<TrainRow> {
        let rows: Vec<ScoreRow> = trajectory(0).into_iter().chain(trajectory(50)).collect();
        let current = score_no_grad(model, &rows, 1.0, 4096).unwrap();
        rows.into_iter()
            .zip(current)
            .enumerate()
            .map(|(k, (r, lp))| TrainRow {
                prompt_ids: r.prompt_ids,
                completion_ids: r.completion_ids,
                old_logprobs: lp
                    .iter()
                    .enumerate()
                    .map(|(j, l)| l + 0.3 * (((j + k) % 3) as f32 - 1.0))
                    .collect(),
                advantage: [1.0, -0.5, 0.25, -1.0, 0.75][k % 5] * if k < 5 { 1.0 } else { -0.6 },
            })
            .collect()
    }

    fn params(model: &Model) -> Vec<Tensor> {
        tch::no_grad(|| {
            model
                .var_store()
                .trainable_variables()
                .iter()
                .map(Tensor::copy)
                .collect()
        })
    }

    /// AdamW epsilon of the packed-vs-unpacked step comparisons (see there).
    const ADAM_EPS: f64 = 1e-4;

    fn max_param_diff(a: &Model, b: &Model) -> f64 {
        params(a)
            .iter()
            .zip(&params(b))
            .map(|(x, y)| (x - y).abs().max().double_value(&[]))
            .fold(0.0, f64::max)
    }

    /// A GRPO step (with and without the k3 reference) and a supervised step give the same
    /// loss, gradient norm and updated weights packed as unpacked, with fewer tokens forward.
    #[test]
    fn packed_learner_steps_equal_unpacked_ones() {
        let base = tiny(23);
        // A reference other than the policy, so the k3 term is not trivially 0.
        let reference = tiny(24);
        let batch = train_rows(&base);
        for kl in [None, Some(0.05)] {
            let config = |pack: bool| LearnerConfig {
                lr: 1e-3,
                eps: ADAM_EPS,
                micro_batch_tokens: 60,
                pack_prefixes: pack,
                grpo: GrpoConfig {
                    kl_coef: kl,
                    ..GrpoConfig::default()
                },
                ..LearnerConfig::default()
            };
            let (plain, packed) = (base.deep_copy().unwrap(), base.deep_copy().unwrap());
            let mut learners: Vec<Learner<'_>> = [(&plain, false), (&packed, true)]
                .into_iter()
                .map(|(m, pack)| match kl {
                    Some(_) => {
                        Learner::with_reference(m, reference.deep_copy().unwrap(), config(pack))
                    }
                    None => Learner::new(m, config(pack)),
                })
                .collect::<Result<_>>()
                .unwrap();
            let a = learners[0].step(&batch).unwrap();
            let b = learners[1].step(&batch).unwrap();
            eprintln!("kl {kl:?}: unpacked {a:?}\n          packed {b:?}");
            assert!((a.loss - b.loss).abs() < 1e-4, "{a:?} vs {b:?}");
            assert!((a.grad_norm - b.grad_norm).abs() < 1e-4 * a.grad_norm.max(1.0));
            assert!((a.clip_frac - b.clip_frac).abs() < 1e-6);
            assert!((a.approx_kl - b.approx_kl).abs() < 1e-5);
            assert!((a.ref_kl - b.ref_kl).abs() < 1e-6 * a.ref_kl.max(1.0));
            assert_eq!(a.ref_kl > 1e-3, kl.is_some(), "{a:?}");
            assert!(a.clip_frac > 0.0 && a.grad_norm > 1e-2, "{a:?}");
            assert_eq!(a.tokens, b.tokens);
            // Two trajectories of 57 packed tokens, one group each under the 60-token budget.
            assert_eq!(b.forward_tokens, 2 * 57);
            assert!(b.forward_tokens < a.forward_tokens, "{a:?} vs {b:?}");
            let moved = max_param_diff(&base, &plain);
            let diff = max_param_diff(&plain, &packed);
            assert!(moved > 5e-4, "moved {moved}");
            eprintln!("weights moved {moved:.2e}, packed vs unpacked {diff:.2e}");
            // AdamW's first update is lr · g / (|g| + eps): ±lr where |g| ≫ eps, linear in g
            // below. With the default eps (1e-8) an element whose gradient is near 1e-8 turns
            // summation-order rounding (thread-count dependent) into a ~lr/2 move, so the
            // comparison runs with `ADAM_EPS`: rounding then moves a weight by ≪ 1 % of lr,
            // while a wrong gradient still moves it by ~lr.
            assert!(diff < 1e-4, "packed and unpacked weights differ by {diff}");
        }

        let sft: Vec<ScoreRow> = trajectory(0).into_iter().chain(trajectory(50)).collect();
        let (plain, packed) = (base.deep_copy().unwrap(), base.deep_copy().unwrap());
        let config = |pack: bool| LearnerConfig {
            lr: 1e-3,
            eps: ADAM_EPS,
            micro_batch_tokens: 60,
            pack_prefixes: pack,
            ..LearnerConfig::default()
        };
        let a = Learner::new(&plain, config(false))
            .unwrap()
            .sft_step(&sft)
            .unwrap();
        let b = Learner::new(&packed, config(true))
            .unwrap()
            .sft_step(&sft)
            .unwrap();
        eprintln!("sft: unpacked {a:?}\n     packed {b:?}");
        // Per-row losses agree too, and add up to the batch loss.
        assert_eq!(a.row_nll.len(), sft.len());
        for (x, y) in a.row_nll.iter().zip(&b.row_nll) {
            assert!((x - y).abs() < 1e-3, "{x} vs {y}");
        }
        let tokens: usize = sft.iter().map(|r| r.completion_ids.len()).sum();
        let from_rows = a.row_nll.iter().sum::<f64>() / tokens as f64;
        assert!(
            (from_rows - a.stats.loss).abs() < 1e-4,
            "{from_rows} vs {}",
            a.stats.loss
        );
        let (a, b) = (a.stats, b.stats);
        assert!((a.loss - b.loss).abs() < 1e-4, "{a:?} vs {b:?}");
        assert!((a.grad_norm - b.grad_norm).abs() < 1e-4 * a.grad_norm.max(1.0));
        assert_eq!(b.forward_tokens, 2 * 57);
        assert!(b.forward_tokens < a.forward_tokens);
        assert!(max_param_diff(&plain, &packed) < 1e-4);
    }

    /// One-off timing, not an assertion: fwd+bwd of a ~2000-token pack (one 1800-token chain and
    /// two 100-token branches) on the tiny random model. Run with
    /// `cargo test --release -p envace-kernels --lib packing::tests::time_packed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn time_packed_forward_backward() {
        let model = tiny(31);
        let trunk = ids(1800, 7);
        let rows = vec![
            row(&trunk[..1790], &trunk[1790..]),
            row(&cat(&[&trunk[..900], &ids(90, 8)]), &ids(10, 9)),
            row(&cat(&[&trunk[..1200], &ids(90, 10)]), &ids(10, 11)),
        ];
        assert_eq!(packed_len(&rows), 2000);
        let run = || {
            let batch = score_packed(&model, &rows, 1.0).unwrap();
            batch.logprobs.sum(Kind::Float).backward();
        };
        run();
        let n = 5;
        let start = std::time::Instant::now();
        for _ in 0..n {
            run();
        }
        eprintln!(
            "packed fwd+bwd, L = 2000: {:.1} ms",
            start.elapsed().as_secs_f64() * 1e3 / f64::from(n)
        );
    }
}
