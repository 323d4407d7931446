//! `fmctl admin`: the operators' controls and how their answers print.

use fmctl::output::Format;
use fmctl::{Client, ClientError, output};
use fmsched_proto::v1 as pb;
use serde::Deserialize;

use crate::cmd::args::AdminCmd;
use crate::print_json;

pub(crate) async fn admin(client: &Client, cmd: AdminCmd, fmt: Format) -> Result<(), ClientError> {
    use fmctl::Cordon;
    let node = |n: pb::Node| match fmt {
        Format::Table => println!("{}", output::nodes_table(std::slice::from_ref(&n))),
        Format::Json => print_json(&output::node_json(&n)),
    };
    match cmd {
        AdminCmd::Cordon { node: id, reason } => {
            node(client.cordon_node(&id, Cordon::Cordon, &reason).await?)
        }
        AdminCmd::Drain { node: id, reason } => {
            node(client.cordon_node(&id, Cordon::Drain, &reason).await?)
        }
        AdminCmd::Uncordon { node: id } => {
            node(client.cordon_node(&id, Cordon::Uncordon, "").await?)
        }
        AdminCmd::RevokeToken { node: id, reason } => {
            node(client.revoke_node_token(&id, &reason).await?)
        }
        AdminCmd::Requeue { job, reason } => {
            client.requeue_job(&job, &reason).await?;
            match fmt {
                Format::Table => println!(
                    "job {job}: re-queue requested; the next round suspends it from its checkpoint"
                ),
                Format::Json => print_json(&serde_json::json!({"job_id": job, "requested": true})),
            }
        }
        AdminCmd::Policy => print_policy(&client.get_policy().await?, fmt),
        AdminCmd::SetPolicy { policy, knobs } => {
            let p = client
                .set_policy(&policy, knobs.into_iter().collect())
                .await?;
            print_policy(&p, fmt);
        }
        AdminCmd::Queues => print_queues(&client.get_queues().await?, fmt),
        AdminCmd::SetQueues { file } => {
            let queues = read_queue_file(&file)?;
            print_queues(&client.set_queues(queues).await?, fmt);
        }
        AdminCmd::Loans => print_loans(&client.list_loans().await?, fmt),
        AdminCmd::Lend { nodes } => print_loans(&client.loan_nodes(nodes).await?, fmt),
        AdminCmd::Reclaim {
            nodes,
            count,
            deadline,
        } => {
            let r = client
                .reclaim_nodes(nodes, count.unwrap_or(0), deadline)
                .await?;
            match fmt {
                Format::Table => {
                    println!("reclaiming {}", r.node_ids.join(", "));
                    println!(
                        "preempted ({}): {}",
                        r.preempted_job_ids.len(),
                        r.preempted_job_ids.join(" ")
                    );
                    println!(
                        "scaled in ({}): {}",
                        r.scaled_in_job_ids.len(),
                        r.scaled_in_job_ids.join(" ")
                    );
                }
                Format::Json => print_json(&serde_json::json!({
                    "node_ids": r.node_ids,
                    "preempted_job_ids": r.preempted_job_ids,
                    "scaled_in_job_ids": r.scaled_in_job_ids,
                })),
            }
        }
        AdminCmd::Audit { limit } => {
            let events = client.audit_events(limit).await?;
            match fmt {
                Format::Table => println!("{}", output::audit_table(&events)),
                Format::Json => print_json(&serde_json::Value::Array(
                    events.iter().map(output::audit_json).collect(),
                )),
            }
        }
    }
    Ok(())
}

fn print_loans(l: &pb::ListLoansResponse, fmt: Format) {
    match fmt {
        Format::Table => {
            println!(
                "{} inference node(s), {} kept unlent",
                l.inference_nodes, l.headroom_nodes
            );
            println!(
                "{:<24} {:<11} {:>8} {:<14} {:<10} PREEMPTED / SCALED IN",
                "NODE", "STATE", "GPUS", "LOANED BY", "OVERDUE"
            );
            for x in &l.loans {
                println!(
                    "{:<24} {:<11} {:>8} {:<14} {:<10} {} / {}",
                    x.node_id,
                    x.state,
                    x.gpus_in_use,
                    x.loaned_by,
                    if x.overdue { "yes" } else { "" },
                    x.preempted_job_ids.len(),
                    x.scaled_in_job_ids.len()
                );
            }
        }
        Format::Json => print_json(&serde_json::json!({
            "inference_nodes": l.inference_nodes,
            "headroom_nodes": l.headroom_nodes,
            "loans": l.loans.iter().map(|x| serde_json::json!({
                "node_id": x.node_id,
                "state": x.state,
                "gpus_in_use": x.gpus_in_use,
                "loaned_by": x.loaned_by,
                "overdue": x.overdue,
                "preempted_job_ids": x.preempted_job_ids,
                "scaled_in_job_ids": x.scaled_in_job_ids,
            })).collect::<Vec<_>>(),
        })),
    }
}

pub(crate) fn print_tune(d: &pb::TuneDecision, fmt: Format) {
    let knobs = |k: &std::collections::HashMap<String, f64>| {
        let mut v: Vec<String> = k.iter().map(|(n, x)| format!("{n}={x}")).collect();
        v.sort();
        v.join(" ")
    };
    match fmt {
        Format::Table => {
            println!(
                "policy {}: {}",
                d.policy,
                if d.adopted {
                    "adopted"
                } else if d.passes {
                    "would adopt (dry run)"
                } else {
                    "kept (no configuration beat the active one by the threshold)"
                }
            );
            println!("active before:  {}", knobs(&d.knobs_before));
            println!("best found:     {}", knobs(&d.proposed));
            println!("active after:   {}", knobs(&d.knobs_after));
            println!(
                "predicted gain {:.3} (threshold {}) on {} predicted jobs ({} carried over, {} after aggregation); {} simulations, {} samples rejected early; {:.2} s",
                d.predicted_gain,
                d.threshold,
                d.trace_jobs,
                d.carried_over,
                d.aggregated_jobs,
                d.simulations,
                d.rejected,
                d.wall_seconds
            );
            if let Some(g) = d.realised_gain {
                println!("realised since the last adoption: {g:.3} (objective after over before)");
            }
        }
        Format::Json => print_json(&serde_json::json!({
            "policy": d.policy,
            "knobs_before": d.knobs_before,
            "proposed": d.proposed,
            "knobs_after": d.knobs_after,
            "predicted_gain": d.predicted_gain,
            "threshold": d.threshold,
            "passes": d.passes,
            "adopted": d.adopted,
            "trace_jobs": d.trace_jobs,
            "carried_over": d.carried_over,
            "aggregated_jobs": d.aggregated_jobs,
            "simulations": d.simulations,
            "rejected": d.rejected,
            "wall_seconds": d.wall_seconds,
            "realised_gain": d.realised_gain,
        })),
    }
}

fn print_queues(q: &pb::QueueSetting, fmt: Format) {
    match fmt {
        Format::Table => println!("{}", output::queues_text(q)),
        Format::Json => print_json(&output::queues_json(q)),
    }
}

/// A TOML file of `[[queues]]` tables, checked for its shape here (the
/// scheduler validates the set).
fn read_queue_file(
    path: &std::path::Path,
) -> Result<Vec<fmsched_core::queue::QueueSpec>, ClientError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        #[serde(default)]
        queues: Vec<fmsched_core::queue::QueueSpec>,
    }
    let spec_err = |message: String| ClientError::Spec {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| spec_err(e.to_string()))?;
    let f: File = toml::from_str(&text).map_err(|e| spec_err(e.to_string()))?;
    Ok(f.queues)
}

fn print_policy(p: &pb::PolicySetting, fmt: Format) {
    match fmt {
        Format::Table => println!("{}", output::policy_text(p)),
        Format::Json => print_json(&output::policy_json(p)),
    }
}
