//! `sluice backfill watch JOB`: a live progress bar of a backfill job, from the API, until
//! the job ends.

use std::io::Write as _;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::Value;

#[derive(Debug, Subcommand)]
pub enum BackfillCommand {
    /// Print a job's progress as it changes, until it completes, fails or is cancelled
    /// (exit status 0 only for completed).
    Watch(WatchArgs),
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The job id (`job_id` of the create answer).
    job_id: String,
    /// The server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// API key to send (X-API-Key); a member of the job's organization.
    #[arg(long, env = "SLUICE_API_KEY", hide_env_values = true)]
    api_key: String,
    /// How often to look, in milliseconds.
    #[arg(long, default_value_t = 500)]
    interval_ms: u64,
}

pub async fn run(command: BackfillCommand) -> anyhow::Result<()> {
    let BackfillCommand::Watch(args) = command;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let url = format!("{}/api/v1/beam/backfills/{}", args.url.trim_end_matches('/'), args.job_id);
    let mut last = String::new();
    loop {
        let response = client
            .get(&url)
            .header("X-API-Key", &args.api_key)
            .send()
            .await
            .with_context(|| format!("reaching {}", args.url))?;
        let status = response.status();
        let job: Value = response.json().await.context("reading the job")?;
        if !status.is_success() {
            bail!("{}: {}", status.as_u16(), job["detail"]);
        }
        let line = progress_line(&job);
        if line != last {
            let mut out = std::io::stdout();
            writeln!(out, "{line}")?;
            out.flush()?;
            last = line;
        }
        match job["status"].as_str().unwrap_or_default() {
            "completed" => return Ok(()),
            "failed" => {
                bail!("the job failed: {}", job["error_message"].as_str().unwrap_or("no message"))
            }
            "cancelled" => bail!("the job was cancelled"),
            _ => tokio::time::sleep(Duration::from_millis(args.interval_ms)).await,
        }
    }
}

/// `[#######-------------] 7/20 chunks  35%  transporting  rows staged 7000, delivered 2450`.
fn progress_line(job: &Value) -> String {
    let status = job["status"].as_str().unwrap_or("?");
    let staged = job["rows_staged"].as_u64().unwrap_or(0);
    let delivered = job["rows_delivered"].as_u64().unwrap_or(0);
    match job["num_chunks"].as_u64() {
        None => format!("[{}] staging…  {status}", "-".repeat(20)),
        Some(total) => {
            let done = total - job["chunks_left"].as_u64().unwrap_or(0).min(total);
            let share = if total == 0 { 1.0 } else { done as f64 / total as f64 };
            let filled = (share * 20.0).round() as usize;
            format!(
                "[{}{}] {done}/{total} chunks {:>4.0}%  {status}  rows staged {staged}, delivered {delivered}",
                "#".repeat(filled),
                "-".repeat(20 - filled),
                share * 100.0
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_follows_chunks_left() {
        let staging =
            serde_json::json!({"status": "staging", "num_chunks": null, "chunks_left": 0});
        assert!(progress_line(&staging).contains("staging"));
        let half = serde_json::json!({"status": "transporting", "num_chunks": 20, "chunks_left": 10,
                                      "rows_staged": 2000, "rows_delivered": 1000});
        assert_eq!(
            progress_line(&half),
            "[##########----------] 10/20 chunks   50%  transporting  rows staged 2000, delivered 1000"
        );
        let empty = serde_json::json!({"status": "completed", "num_chunks": 0, "chunks_left": 0});
        assert!(progress_line(&empty).starts_with("[####################] 0/0 chunks  100%"));
    }
}
