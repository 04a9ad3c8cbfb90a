//! The step scheduler: many sessions on one engine, their transformer forwards batched.
//!
//! [`next_chunks`] runs the next chunk of several sessions together. Their blocks are
//! denoised in rounds: each round takes every session's next forward (whichever DMD
//! step or commit it is at: each sample carries its own timestep) and runs them as one
//! [`WanTransformer::forward_batch`](headroom_model::WanTransformer::forward_batch):
//! their tokens stacked for every linear layer, norm and modulation, while
//! self-attention stays per session against its own KV pages, cross-attention against
//! its own prompt, camera tokens per session. Rows never mix, so a session's bytes are
//! those of the same session run alone, and a session never knows whether it ran
//! alone. Sessions of different resolutions share a batch as ragged token runs. Each
//! session then commits its block and decodes it through its own decoder state.
//!
//! What batching buys: one GEMM of M = Σ tokens instead of one per session (a `world`
//! block is 144 tokens, far below where a GEMM reaches its rate), and one pass over
//! the weights per round instead of one per session.

use headroom_mem::Phase;
use headroom_tensor::ops::attention::Mask;

use crate::error::{EngineError, Result};
use crate::session::{BlockRun, Chunk, Session};

/// Runs the next chunk of every session in `sessions` together and returns each one's
/// chunk (or error) in the same order. Sessions that share the first batchable
/// session's model run their forwards batched; any other (a different model, or one
/// that decodes ahead on its own thread with `overlap`) runs its chunk alone. A session
/// that fails or is cancelled leaves the batch and releases what it held; the others go
/// on.
pub fn next_chunks(sessions: &mut [&mut Session]) -> Vec<Result<Chunk>> {
    let mut results: Vec<Option<Result<Chunk>>> = sessions.iter().map(|_| None).collect();
    let dit = sessions
        .iter()
        .find(|s| s.batches())
        .map(|s| std::sync::Arc::clone(s.dit()));
    // (session index, block index, the block's run) of every batched session.
    let mut runs: Vec<(usize, usize, Option<BlockRun>)> = Vec::new();
    for (i, session) in sessions.iter_mut().enumerate() {
        let same_model = dit
            .as_ref()
            .is_some_and(|d| std::sync::Arc::ptr_eq(d, session.dit()));
        if !session.batches() || !same_model {
            results[i] = Some(session.next_chunk());
            continue;
        }
        match session
            .chunk_start()
            .and_then(|n| Ok((n, session.begin_block(n)?)))
        {
            Ok((n, run)) => runs.push((i, n, Some(run))),
            Err(e) => results[i] = Some(settled(session, e)),
        }
    }
    let Some(dit) = dit else {
        return collect(results);
    };
    loop {
        // Every running session's next forward; one that is cancelled leaves here.
        let mut batch = Vec::new();
        for (j, (i, _, run)) in runs.iter_mut().enumerate() {
            let Some(block) = run.as_ref() else { continue };
            match sessions[*i].step_input(block) {
                Ok(Some(step)) => batch.push((j, step)),
                Ok(None) => {}
                Err(e) => {
                    *run = None;
                    results[*i] = Some(settled(sessions[*i], e));
                }
            }
        }
        if batch.is_empty() {
            break;
        }
        let outputs = {
            let items: Vec<_> = batch
                .iter()
                .map(|(j, step)| {
                    let (i, _, run) = &runs[*j];
                    let run = run.as_ref().expect("a session in the batch has its run");
                    sessions[*i].batch_item(run, step)
                })
                .collect();
            dit.forward_batch(&items, Mask::None)
        };
        match outputs {
            Ok(outputs) => {
                for ((j, step), (v, own)) in batch.into_iter().zip(outputs) {
                    let (i, _, run) = &mut runs[j];
                    let block = run.as_mut().expect("a session in the batch has its run");
                    if let Err(e) = sessions[*i].step_output(block, step, v, own) {
                        *run = None;
                        results[*i] = Some(settled(sessions[*i], e));
                    }
                }
            }
            Err(e) => {
                let cause = e.to_string();
                let mut first = Some(EngineError::from(e));
                for (j, _) in batch {
                    let (i, _, run) = &mut runs[j];
                    *run = None;
                    let e = first
                        .take()
                        .unwrap_or_else(|| EngineError::Batch(cause.clone()));
                    results[*i] = Some(settled(sessions[*i], e));
                }
            }
        }
    }
    // Commit every block, then decode each through its session's own state.
    let mut denoised = Vec::new();
    for (i, n, run) in runs {
        let Some(run) = run else { continue };
        match sessions[i].finish_block(run) {
            Ok(block) => denoised.push((i, n, block)),
            Err(e) => results[i] = Some(settled(sessions[i], e)),
        }
    }
    if !denoised.is_empty() {
        let platform = dit.device().platform().clone();
        platform.phase(Phase::DenoiseEnd);
        let stats = platform.memory_stats();
        for (i, n, block) in denoised {
            let chunk = sessions[i].decode_chunk(n, block, stats.clone());
            sessions[i].settle(&chunk);
            results[i] = Some(chunk);
        }
    }
    collect(results)
}

/// The error `e` as a session's result, after the session released what it held.
fn settled(session: &mut Session, e: EngineError) -> Result<Chunk> {
    let result = Err(e);
    session.settle(&result);
    result
}

fn collect(results: Vec<Option<Result<Chunk>>>) -> Vec<Result<Chunk>> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(EngineError::request("session", "no chunk was run"))))
        .collect()
}
