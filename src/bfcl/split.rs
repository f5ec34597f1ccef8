//! The fixed train/test split of the BFCL multi-turn scenarios, stratified by the API classes a
//! scenario involves.
//!
//! The 200 `multi_turn_base` scenarios come in id-ordered blocks by class (ids 150–199 are all
//! `TravelAPI`, which no lower id uses), so a split by id range would test an API the model
//! never trains on. Here a test set has to come from the training distribution:
//!
//! 1. **Strata.** A scenario's stratum is its set of `involved_classes` (sorted): 20 strata
//!    with the shipped data, from 20 `TradingBot`-only scenarios down to 2
//!    `MathAPI + TravelAPI` ones.
//! 2. **Quotas.** The test set has [`TEST_SIZE`] = 50 of the 200 scenarios (a quarter). Each
//!    stratum of `n` scenarios gets `n · 50 / 200` test places, rounded by largest remainder
//!    (ties: the larger stratum first, then the stratum's name), so the quotas sum to 50 and
//!    every stratum keeps at least one training scenario.
//! 3. **Places.** Within a stratum of `n` scenarios sorted by index, the `q` test scenarios sit at
//!    positions `⌊(2j + 1)·n / 2q⌋` for `j = 0 … q−1`: evenly spread over the stratum's ids.
//!
//! No random numbers are drawn: the split follows from the data alone, and
//! `envace bfcl split [--json]` prints it with per-class counts. Every class of every test
//! scenario occurs in training scenarios (a test's stratum always keeps training members).
//!
//! The split is by **scenario index**: `multi_turn_miss_param_7`, `…_miss_func_7` and
//! `…_long_context_7` perturb `multi_turn_base_7`, so all four are on the side `base_7` is on,
//! and a perturbed copy of a training scenario is never a test task.

use std::collections::{BTreeMap, BTreeSet};

use envace_actors::task::Split;
use serde::Serialize;

use super::tasks::{BfclTask, Category};

/// Scenarios in the test split (of the 200 shipped; a quarter of any other count).
pub const TEST_SIZE: usize = 50;

/// The split: which scenario indices are test scenarios, and the strata it was drawn from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScenarioSplit {
    /// Test scenario indices (`multi_turn_<category>_<index>`), sorted.
    pub test: BTreeSet<usize>,
    /// Training scenario indices, sorted.
    pub train: BTreeSet<usize>,
    /// Each stratum (its classes joined by `+`) with its train and test indices.
    pub strata: BTreeMap<String, Stratum>,
}

/// One stratum of the split: the scenarios with the same set of involved classes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stratum {
    /// The classes, sorted.
    pub classes: Vec<String>,
    /// Training scenario indices, sorted.
    pub train: Vec<usize>,
    /// Test scenario indices, sorted.
    pub test: Vec<usize>,
}

/// Why the split could not be drawn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// A base task id has no numeric suffix.
    #[error("task id {0:?} has no scenario index (expected multi_turn_base_<n>)")]
    NoIndex(String),
    /// Two base tasks share a scenario index.
    #[error("scenario index {0} occurs twice among the base tasks")]
    DuplicateIndex(usize),
    /// The tasks given are not `multi_turn_base` tasks.
    #[error("task {0} is not a multi_turn_base task: the split is drawn from the base scenarios")]
    NotBase(String),
}

impl ScenarioSplit {
    /// Draws the split from the `multi_turn_base` tasks (see the module doc).
    ///
    /// # Errors
    /// [`SplitError`] for a task of another category, a task id without a numeric suffix, or two
    /// tasks with the same index.
    pub fn from_base(base: &[BfclTask]) -> Result<Self, SplitError> {
        let mut by_stratum: BTreeMap<String, (Vec<String>, Vec<usize>)> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for task in base {
            if task.category != Category::Base {
                return Err(SplitError::NotBase(task.id.clone()));
            }
            let index = task
                .index()
                .ok_or_else(|| SplitError::NoIndex(task.id.clone()))?;
            if !seen.insert(index) {
                return Err(SplitError::DuplicateIndex(index));
            }
            let mut classes = task.involved_classes.clone();
            classes.sort();
            classes.dedup();
            by_stratum
                .entry(classes.join("+"))
                .or_insert_with(|| (classes, Vec::new()))
                .1
                .push(index);
        }
        let total = seen.len();
        let test_size = if total == 200 { TEST_SIZE } else { total / 4 };
        let quotas = largest_remainder(
            &by_stratum
                .iter()
                .map(|(key, (_, ids))| (key.as_str(), ids.len()))
                .collect::<Vec<_>>(),
            test_size,
        );
        let mut split = ScenarioSplit {
            test: BTreeSet::new(),
            train: BTreeSet::new(),
            strata: BTreeMap::new(),
        };
        for ((key, (classes, mut ids)), q) in by_stratum.into_iter().zip(quotas) {
            ids.sort_unstable();
            let n = ids.len();
            let places: BTreeSet<usize> = evenly_spaced(n, q).into_iter().collect();
            let (mut test, mut train) = (Vec::new(), Vec::new());
            for (pos, &index) in ids.iter().enumerate() {
                if places.contains(&pos) {
                    test.push(index);
                } else {
                    train.push(index);
                }
            }
            split.test.extend(&test);
            split.train.extend(&train);
            split.strata.insert(
                key,
                Stratum {
                    classes,
                    train,
                    test,
                },
            );
        }
        Ok(split)
    }

    /// The side of scenario `index`; an index the base tasks did not have is a test scenario
    /// (it was never trained on).
    pub fn of_index(&self, index: usize) -> Split {
        if self.train.contains(&index) {
            Split::Train
        } else {
            Split::Test
        }
    }

    /// The side of a task of any category: its scenario's (see the module doc). A task id
    /// without an index is a test task.
    pub fn of(&self, task: &BfclTask) -> Split {
        task.index().map_or(Split::Test, |i| self.of_index(i))
    }

    /// Per class: (training scenarios, test scenarios) that involve it.
    pub fn class_counts(&self) -> BTreeMap<String, (usize, usize)> {
        let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for s in self.strata.values() {
            for class in &s.classes {
                let c = counts.entry(class.clone()).or_default();
                c.0 += s.train.len();
                c.1 += s.test.len();
            }
        }
        counts
    }
}

/// `n` of the positions `0..len`, spread evenly: position `⌊(2j + 1)·len / 2n⌋` for
/// `j = 0..n` (the middle of each of `n` equal stretches), in increasing order; all of them
/// when `n ≥ len`.
pub fn evenly_spaced(len: usize, n: usize) -> Vec<usize> {
    if n >= len {
        return (0..len).collect();
    }
    (0..n).map(|j| (2 * j + 1) * len / (2 * n)).collect()
}

/// Splits `total` places over `sizes` in proportion (largest remainder; ties go to the larger
/// stratum, then to the smaller key), never giving a stratum all of its members.
fn largest_remainder(sizes: &[(&str, usize)], total: usize) -> Vec<usize> {
    let n: usize = sizes.iter().map(|(_, s)| s).sum();
    if n == 0 {
        return vec![0; sizes.len()];
    }
    let cap = |size: usize| size.saturating_sub(1);
    let mut quotas: Vec<usize> = sizes
        .iter()
        .map(|&(_, s)| (s * total / n).min(cap(s)))
        .collect();
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    // Remainder of s·total/n, compared as integers (s·total mod n).
    order.sort_by(|&a, &b| {
        let rem = |i: usize| (sizes[i].1 * total) % n;
        rem(b)
            .cmp(&rem(a))
            .then(sizes[b].1.cmp(&sizes[a].1))
            .then(sizes[a].0.cmp(sizes[b].0))
    });
    let mut left = total.saturating_sub(quotas.iter().sum());
    while left > 0 {
        let before = left;
        for &i in &order {
            if left == 0 {
                break;
            }
            if quotas[i] < cap(sizes[i].1) {
                quotas[i] += 1;
                left -= 1;
            }
        }
        if left == before {
            break; // every stratum is at its cap
        }
    }
    quotas
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bfcl::tasks::load_installed;

    fn base_split() -> (Vec<BfclTask>, ScenarioSplit) {
        let base = load_installed(Category::Base).expect("BFCL base tasks (make setup)");
        let split = ScenarioSplit::from_base(&base).expect("split");
        (base, split)
    }

    #[test]
    fn quarter_of_each_stratum_by_largest_remainder() {
        let q = largest_remainder(&[("a", 20), ("b", 19), ("c", 2), ("d", 3), ("e", 6)], 12);
        // 20·12/50 = 4.8, 19·12/50 = 4.56, 2·12/50 = 0.48, 3·12/50 = 0.72, 6·12/50 = 1.44:
        // floors 4, 4, 0, 0, 1 = 9; remainders .8 (a), .72 (d), .56 (b) take the last 3.
        assert_eq!(q, vec![5, 5, 0, 1, 1]);
        assert_eq!(q.iter().sum::<usize>(), 12);
        // A stratum never gives all of its members.
        assert_eq!(largest_remainder(&[("a", 1), ("b", 1)], 2), vec![0, 0]);
    }

    #[test]
    fn split_is_150_50_and_every_test_class_is_trained_on() {
        let (base, split) = base_split();
        assert_eq!((split.train.len(), split.test.len()), (150, 50));
        assert!(split.train.is_disjoint(&split.test));
        let train_classes: BTreeSet<&str> = base
            .iter()
            .filter(|t| split.of(t) == Split::Train)
            .flat_map(|t| t.involved_classes.iter().map(String::as_str))
            .collect();
        for t in base.iter().filter(|t| split.of(t) == Split::Test) {
            for class in &t.involved_classes {
                assert!(train_classes.contains(class.as_str()), "{}: {class}", t.id);
            }
        }
        // Every stratum keeps training scenarios, and holds about a quarter of test ones.
        for (key, s) in &split.strata {
            let n = s.train.len() + s.test.len();
            assert!(!s.train.is_empty(), "{key}");
            assert!(
                s.test.len() <= n.div_ceil(4),
                "{key}: {} of {n}",
                s.test.len()
            );
        }
        // TravelAPI, the class of ids 150–199, is now in both splits.
        let (train, test) = split.class_counts()["TravelAPI"];
        assert_eq!((train, test), (37, 13));
        // Not a block of ids: the test set spans the whole id range.
        assert!(split.test.iter().any(|&i| i < 50) && split.test.iter().any(|&i| i >= 150));
    }

    #[test]
    fn the_split_is_pinned() {
        // The documented split: a change to the rule or the data shows here.
        let (_, split) = base_split();
        let test: Vec<usize> = split.test.iter().copied().collect();
        assert_eq!(
            test,
            [
                5, 6, 13, 16, 19, 22, 24, 31, 36, 37, 43, 47, 53, 56, 59, 62, 68, 71, 76, 81, 83,
                88, 89, 91, 96, 105, 108, 110, 117, 122, 128, 131, 133, 134, 139, 142, 143, 155,
                156, 164, 166, 170, 172, 173, 180, 186, 191, 193, 195, 197
            ]
        );
    }

    #[test]
    fn every_category_follows_its_scenario() {
        let (base, split) = base_split();
        let by_index: BTreeMap<usize, &BfclTask> = base
            .iter()
            .map(|t| (t.index().expect("index"), t))
            .collect();
        for category in [
            Category::MissParam,
            Category::MissFunc,
            Category::LongContext,
        ] {
            let tasks = load_installed(category).expect("installed category");
            assert_eq!(tasks.len(), 200, "{category}");
            for t in &tasks {
                let i = t.index().expect("index");
                let scenario = by_index[&i];
                // The index really names the same scenario: the same classes.
                assert_eq!(t.involved_classes, scenario.involved_classes, "{}", t.id);
                assert_eq!(split.of(t), split.of(scenario), "{}", t.id);
            }
            let test = tasks.iter().filter(|t| split.of(t) == Split::Test).count();
            assert_eq!(test, 50, "{category}");
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let (base, _) = base_split();
        let mut twice = base[..3].to_vec();
        twice.push(base[0].clone());
        assert_eq!(
            ScenarioSplit::from_base(&twice),
            Err(SplitError::DuplicateIndex(0))
        );
        let mut other = base[..2].to_vec();
        other[1].category = Category::MissParam;
        assert!(matches!(
            ScenarioSplit::from_base(&other),
            Err(SplitError::NotBase(_))
        ));
        let mut unnamed = base[..2].to_vec();
        unnamed[0].id = "multi_turn_base_x".into();
        assert!(matches!(
            ScenarioSplit::from_base(&unnamed),
            Err(SplitError::NoIndex(_))
        ));
    }
}
