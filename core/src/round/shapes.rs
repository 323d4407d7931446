//! What fits where: GPU families a job may run on, the node shapes a
//! replica needs, which allocation sizes are whole replicas, and the shape
//! the caller estimates a job on. Used by [`super::prepare`] and the later
//! phases; decides nothing about who runs.

use std::collections::{BTreeMap, BTreeSet};

use super::view::{ClusterView, JobView, NodeView};
use crate::node::NodeState;
use crate::policy::{MergeMode, Replica};

/// No node of the cluster can hold `job`'s profiling run (one GPU, or one
/// pipeline replica, of its GPU model).
pub(super) fn cannot_profile(job: &JobView, nodes: &[(u32, &str)]) -> bool {
    never_fits(job.replica(), 1, job.gpu_model.as_deref(), nodes, None).is_some()
        || fits_no_family_of(job, nodes)
}

/// [`fits_no_family`] of a view job on these nodes.
pub(super) fn fits_no_family_of(job: &JobView, nodes: &[(u32, &str)]) -> bool {
    let families: Vec<&str> = nodes.iter().map(|n| n.1).collect();
    fits_no_family(&families, job.gpu_model.as_deref(), &job.unfit_families)
}

/// Every GPU family of `families` (the cluster's, one per node or once)
/// that a job may use — its own `gpu_model`, if it names one — is one its
/// model does not fit (`unfit`, [`JobView::unfit_families`]). No family
/// (an empty cluster) says nothing. The service's round and fmsim's
/// workload check both ask this.
pub fn fits_no_family(families: &[&str], gpu_model: Option<&str>, unfit: &[String]) -> bool {
    !families.is_empty()
        && families
            .iter()
            .filter(|f| gpu_model.is_none_or(|m| m == **f))
            .all(|f| unfit.iter().any(|u| u == f))
}

/// Why a job fits no family: one replica of `model` does not fit the GPU
/// memory of `families`.
pub fn unfit_reason(model: &str, families: &[String]) -> String {
    format!(
        "one replica of {model} does not fit the GPU memory of {}",
        families.join(", ")
    )
}

/// `(GPUs, GPU family)` of these view nodes, for [`never_fits`].
pub(super) fn node_shapes<'v>(view: &'v ClusterView, nodes: &[usize]) -> Vec<(u32, &'v str)> {
    nodes
        .iter()
        .map(|&n| (view.nodes[n].gpus, view.nodes[n].gpu_model.as_str()))
        .collect()
}

/// Why no set of these nodes (`(GPUs, GPU family)` each) can ever hold a
/// job of at least `min_gpus` in replicas of `replica` (each on one node),
/// on `gpu_model` or any one family, when a group may span
/// `max_nodes_per_group` nodes, or None if one can. An empty cluster holds nothing yet and says nothing
/// (nodes may still register). The service's round and fmsim's workload
/// check both ask this.
pub fn never_fits(
    replica: Replica,
    min_gpus: u32,
    gpu_model: Option<&str>,
    nodes: &[(u32, &str)],
    max_nodes_per_group: Option<usize>,
) -> Option<String> {
    if nodes.is_empty() {
        return None;
    }
    let mut families: Vec<&str> = nodes.iter().map(|n| n.1).collect();
    families.sort_unstable();
    families.dedup();
    if let Some(m) = gpu_model {
        if !families.contains(&m) {
            return Some(format!(
                "no node has GPU model {m} (the cluster has {})",
                families.join(", ")
            ));
        }
        families = vec![m];
    }
    let mut why = None;
    for fam in &families {
        let sizes: Vec<u32> = nodes.iter().filter(|n| n.1 == *fam).map(|n| n.0).collect();
        let w = never_fits_sizes(replica, min_gpus, &sizes, max_nodes_per_group)?;
        why.get_or_insert(if families.len() > 1 || gpu_model.is_some() {
            format!("{w} (on {fam} nodes; a job runs on one GPU model)")
        } else {
            w
        });
    }
    why
}

/// `row` with every allocation that is not a whole number of `unit`-GPU
/// replicas made `+∞`.
pub(super) fn mask_replicas(allocs: &[u32], unit: u32, least: u32, row: &[f64]) -> Vec<f64> {
    allocs
        .iter()
        .zip(row)
        .map(|(&a, &t)| {
            if a.is_multiple_of(unit) && a >= least {
                t
            } else {
                f64::INFINITY
            }
        })
        .collect()
}

/// The GPU family and node size a job's times are estimated on: a job's
/// remaining time at each allocation is one number per round, not one per
/// family, so it is estimated on the family it asks for; else the one it
/// holds GPUs on now (keeping them costs nothing); else the cluster's
/// ([`default_shape`]). The node size is that family's largest present
/// node. None when no node of the family is present. The service's
/// estimates and fmsim's ask this.
pub fn estimate_shape(view: &ClusterView, job: &JobView) -> Option<(String, u32)> {
    if job.gpu_model.is_none() {
        let held = job
            .holds
            .first()
            .and_then(|g| view.nodes.get(g.0))
            .filter(|n| !job.unfit_families.contains(&n.gpu_model));
        if let Some(shape) = held.and_then(|n| largest_of(&view.nodes, &n.gpu_model)) {
            return Some(shape);
        }
    }
    default_shape(&view.nodes, job.gpu_model.as_deref(), &job.unfit_families)
}

/// [`estimate_shape`] of a job that holds no GPUs: the family it asks for,
/// else the one with the most GPUs on nodes that are not Offline among
/// those it can run on (not in `unfit`; ties: the first by name), and that
/// family's largest present node.
pub fn default_shape(
    nodes: &[NodeView],
    gpu_model: Option<&str>,
    unfit: &[String],
) -> Option<(String, u32)> {
    if let Some(m) = gpu_model {
        return largest_of(nodes, m);
    }
    let mut gpus: BTreeMap<&str, u32> = BTreeMap::new();
    for n in nodes
        .iter()
        .filter(|n| n.state != NodeState::Offline && n.gpus > 0 && !unfit.contains(&n.gpu_model))
    {
        *gpus.entry(n.gpu_model.as_str()).or_default() += n.gpus;
    }
    // max_by_key keeps the last of equals: walk the names backwards.
    let (family, _) = gpus.iter().rev().max_by_key(|e| *e.1)?;
    largest_of(nodes, family)
}

/// Fills [`JobView::family_time_ratio`] of each job that trains alone or
/// waits to, or is in a temporal merge (it is in no spatial merge and
/// names no GPU model): its time on every
/// other GPU family of the cluster at the GPUs it holds (B of a temporal
/// merge: at the GPUs its A holds, where it will train), relative to its
/// time where it runs, for placement's move to a faster family; for a job
/// that holds none (or holds a profiling run's), at its smallest
/// allocation relative to the family its times are estimated on
/// ([`default_shape`]), for placement's choice of family.
/// `time(v, family, gpus, per_node)` is job `v`'s time (any unit)
/// on `gpus` GPUs of `family` packed on nodes of `per_node` (each family's
/// largest present node, as estimates pack on it); `None` where it is not
/// known or cannot run, and for a job its caller keeps where it is.
/// Nothing on a cluster of one family. fmsim reads the times from the
/// throughput table its progress comes from, the service from the table
/// its estimates come from.
pub fn family_time_ratios<E>(
    view: &mut ClusterView,
    mut time: impl FnMut(usize, &str, u32, u32) -> Result<Option<f64>, E>,
) -> Result<(), E> {
    let families: BTreeSet<&str> = view
        .nodes
        .iter()
        .filter(|n| n.state != NodeState::Offline && n.gpus > 0)
        .map(|n| n.gpu_model.as_str())
        .collect();
    if families.len() < 2 {
        return Ok(());
    }
    let per_node: BTreeMap<String, u32> = families
        .iter()
        .filter_map(|&f| largest_of(&view.nodes, f))
        .collect();
    let spatial: BTreeSet<usize> = view
        .merges
        .iter()
        .filter(|m| m.mode != MergeMode::Temporal)
        .flat_map(|m| [m.a, m.b])
        .collect();
    // B of a temporal merge trains on A's GPUs once A is done: its times
    // are on those.
    let lead: BTreeMap<usize, usize> = view
        .merges
        .iter()
        .filter(|m| m.mode == MergeMode::Temporal)
        .map(|m| (m.b, m.a))
        .collect();
    let usable = |t: Option<f64>| t.filter(|t| t.is_finite() && *t > 0.0);
    for v in 0..view.jobs.len() {
        let j = &view.jobs[v];
        if j.gpu_model.is_some() || spatial.contains(&v) {
            continue;
        }
        // A profiling run's GPUs are not where the job will train.
        let holder = lead.get(&v).map_or(j, |&a| &view.jobs[a]);
        let training = holder.holds.first().filter(|_| !holder.profiling_run);
        let (here, gpus) = match training {
            Some(g) => match view.nodes.get(g.0) {
                Some(n) => (n.gpu_model.clone(), holder.holds.len() as u32),
                None => continue,
            },
            // One that holds none: against the family its times are
            // estimated on, at its smallest allocation.
            None => match default_shape(&view.nodes, None, &j.unfit_families) {
                Some((family, _)) => (family, j.min_gpus.max(j.replica().gpus()).max(1)),
                None => continue,
            },
        };
        let Some(&own_node) = per_node.get(&here) else {
            continue;
        };
        let Some(own) = usable(time(v, &here, gpus, own_node)?) else {
            continue;
        };
        let mut ratios = Vec::new();
        for (f, &node) in &per_node {
            if *f != here
                && !j.unfit_families.contains(f)
                && let Some(t) = usable(time(v, f, gpus, node)?)
            {
                ratios.push((f.clone(), t / own));
            }
        }
        view.jobs[v].family_time_ratio = ratios;
    }
    Ok(())
}

/// `family` and the GPUs of its largest node that is not Offline.
fn largest_of(nodes: &[NodeView], family: &str) -> Option<(String, u32)> {
    nodes
        .iter()
        .filter(|n| n.state != NodeState::Offline && n.gpu_model == family)
        .map(|n| n.gpus)
        .max()
        .filter(|&g| g > 0)
        .map(|g| (family.to_string(), g))
}

/// [`never_fits`] on nodes of one family.
fn never_fits_sizes(
    replica: Replica,
    min_gpus: u32,
    node_gpus: &[u32],
    max_nodes_per_group: Option<usize>,
) -> Option<String> {
    let largest = node_gpus.iter().copied().max()?;
    let total: u32 = node_gpus.iter().sum();
    match replica {
        Replica::Pipeline if !crate::policy::pipeline_fits(node_gpus.iter().copied()) => {
            return Some(format!(
                "a pipeline-parallel job needs {} GPUs on one node (one replica of its {} stages) and the largest node has {largest}",
                crate::policy::PIPELINE_STAGES,
                crate::policy::PIPELINE_STAGES
            ));
        }
        Replica::Experts(ep) if ep > largest => {
            return Some(format!(
                "an expert-parallel job needs {ep} GPUs on one node (one group of its experts) and the largest node has {largest}"
            ));
        }
        Replica::Worker(g) if g > largest => {
            return Some(format!(
                "a worker of this elastic job needs {g} GPUs on one node and the largest node has {largest}"
            ));
        }
        _ => {}
    }
    if max_nodes_per_group == Some(1) && min_gpus > largest {
        return Some(format!(
            "needs at least {min_gpus} GPUs on one node and the largest node has {largest} (jobs do not span nodes here)"
        ));
    }
    if min_gpus > total {
        return Some(format!(
            "needs at least {min_gpus} GPUs and the cluster has {total}"
        ));
    }
    None
}
