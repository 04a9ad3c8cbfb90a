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
//! session then commits its block. The VAE work batches too: the image conditions of
//! sessions at the same block and size are encoded as one batch before the blocks
//! start, and the decodes of sessions whose latents have one shape and whose decoders
//! stand at the same point run as one batch, each session's cache slots stacked along
//! the batch axis for the chunk and handed back after (same bytes as alone). A batched
//! decode looks at each session's cancel token before it starts, not between latent
//! frames; a session decoding alone keeps those finer checks.
//!
//! Under the planned allocator each session has its own span, planned for the session
//! alone. A round of one session runs wholly inside it, as it would alone. A session
//! stepped with others is detached from its plan for the rest of its life (its arena
//! goes back once empty, its planned peak stays committed for admission): the stacked
//! forward and the batched VAE work are not what its plan describes, and an arena
//! kept idle beside the cache would reserve its work twice. Instead, a round of several
//! sessions runs in shared spans planned for that round's composition, one for its
//! denoise and one for its decode (`engine/round_plan.rs`), each closed when its half
//! ends; so does a round of one detached session (a composition of one), so that a
//! server whose sessions come and go stays planned whatever its rounds hold.
//!
//! What batching buys: one GEMM of M = Σ tokens instead of one per session (a `world`
//! block is 144 tokens, far below where a GEMM reaches its rate), and one pass over
//! the weights per round instead of one per session.

use std::sync::Arc;
use std::time::Instant;

use headroom_mem::{CachingAllocator, MemoryStats};
use headroom_model::{OutputFormat, StreamingDecodeState};
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::Tensor;

use crate::condition::ImageCondition;
use crate::error::{EngineError, Result};
use crate::phases;
use crate::session::{frames_of, BlockRun, Chunk, Denoised, Session};

/// Runs the next chunk of every session in `sessions` together and returns each one's
/// chunk (or error) in the same order. Sessions that share the first batchable
/// session's model run their forwards batched; any other (a different model, or one
/// that decodes ahead on its own thread with `overlap`) runs its chunk alone. A session
/// that fails or is cancelled leaves the batch and releases what it held; the others go
/// on.
pub fn next_chunks(sessions: &mut [&mut Session]) -> Vec<Result<Chunk>> {
    next_chunks_in(sessions, None)
}

/// The key of the batched round of `starts` ((session index, block)), its plans
/// installed by the members' round planner; `None` (the round runs on the caching
/// path) where a member has no planner (a session not admitted under `planned`) or the
/// members' planners differ.
fn prepare_round(
    allocator: &CachingAllocator,
    sessions: &[&mut Session],
    starts: &[(usize, usize)],
) -> Option<String> {
    let mut members = Vec::with_capacity(starts.len());
    for &(i, n) in starts {
        let member = sessions[i].round_member()?;
        members.push((member.as_ref(), n, sessions[i].chunks_total()));
    }
    let (first, ..) = *members.first()?;
    if !members.iter().all(|(m, ..)| m.shares_planner(first)) {
        return None;
    }
    first.planner.prepare(allocator, &members)
}

/// [`next_chunks`], a batched round's allocations in the shared spans of round `round`
/// when given (the meta twin recording a round), else of the round that its members'
/// planner keys ([`prepare_round`]).
pub(crate) fn next_chunks_in(
    sessions: &mut [&mut Session],
    round: Option<&str>,
) -> Vec<Result<Chunk>> {
    // Shared work belongs to no session's span; each session's own stages enter its
    // span below. One session alone keeps its span throughout.
    let _shared = match sessions {
        [only] => only.enter_span(),
        _ => match sessions.first() {
            Some(first) => first.no_span(),
            None => return Vec::new(),
        },
    };
    let mut results: Vec<Option<Result<Chunk>>> = sessions.iter().map(|_| None).collect();
    let dit = sessions
        .iter()
        .find(|s| s.batches())
        .map(|s| Arc::clone(s.dit()));
    // (session index, block index) of every batched session, in session order.
    let mut starts: Vec<(usize, usize)> = Vec::new();
    for (i, session) in sessions.iter_mut().enumerate() {
        let same_model = dit.as_ref().is_some_and(|d| Arc::ptr_eq(d, session.dit()));
        if !session.batches() || !same_model {
            results[i] = Some(session.next_chunk());
            continue;
        }
        let _inside = session.enter_span();
        match session.chunk_start() {
            Ok(n) => starts.push((i, n)),
            Err(e) => results[i] = Some(settled(session, e)),
        }
    }
    let Some(dit) = dit else {
        return collect(results);
    };
    let allocator = dit.device().platform().allocator().clone();
    let mut round_key = None;
    // A round of several, or of one session its own plan no longer describes (it was
    // stepped with others), runs in the spans planned for its composition.
    let lone_detached = matches!(starts[..], [(i, _)] if sessions[i].detached());
    if starts.len() > 1 || lone_detached || round.is_some() {
        for &(i, _) in &starts {
            sessions[i].detach_span();
        }
        round_key = match round {
            Some(key) => Some(key.to_string()),
            None => prepare_round(&allocator, sessions, &starts),
        };
    }
    let members: Vec<usize> = starts.iter().map(|&(i, _)| i).collect();
    let mut round_span = round_key
        .as_deref()
        .and_then(|key| enter_round(&allocator, key, sessions, &members));
    let mut in_round = round_span.map(|id| allocator.enter_span(Some(id)));
    encode_conditions(sessions, &mut starts, &mut results);
    let mut runs: Vec<(usize, usize, Option<BlockRun>)> = Vec::new();
    for (i, n) in starts {
        let _inside = sessions[i].enter_span();
        match sessions[i].begin_block(n) {
            Ok(run) => runs.push((i, n, Some(run))),
            Err(e) => results[i] = Some(settled(sessions[i], e)),
        }
    }
    loop {
        // Every running session's next forward; one that is cancelled leaves here.
        let mut batch = Vec::new();
        for (j, (i, _, run)) in runs.iter_mut().enumerate() {
            let Some(block) = run.as_ref() else { continue };
            let _inside = sessions[*i].enter_span();
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
        // Under camera guidance a session's still-camera forward rides in the same batch,
        // after every session's own: `guided[n]` is entry n's place among them.
        let mut guided = vec![None; batch.len()];
        let outputs = {
            let (mut items, mut still_items) = (Vec::new(), Vec::new());
            for (n, (j, step)) in batch.iter().enumerate() {
                let (i, _, run) = &runs[*j];
                let run = run.as_ref().expect("a session in the batch has its run");
                let _inside = sessions[*i].enter_span();
                items.push(sessions[*i].batch_item(run, step));
                if let Some(item) = sessions[*i].guided_item(run, step) {
                    guided[n] = Some(still_items.len());
                    still_items.push(item);
                }
            }
            items.append(&mut still_items);
            dit.forward_batch(&items, Mask::None)
        };
        match outputs {
            Ok(mut outputs) => {
                let mut still: Vec<_> = outputs
                    .split_off(batch.len())
                    .into_iter()
                    .map(|(v, _)| Some(v))
                    .collect();
                for (n, ((j, step), (v, own))) in batch.into_iter().zip(outputs).enumerate() {
                    let still_v = guided[n].and_then(|g| still[g].take());
                    let (i, _, run) = &mut runs[j];
                    let block = run.as_mut().expect("a session in the batch has its run");
                    let _inside = sessions[*i].enter_span();
                    if let Err(e) = sessions[*i].step_output(block, step, v, own, still_v) {
                        *run = None;
                        results[*i] = Some(settled(sessions[*i], e));
                    }
                }
            }
            Err(e) => {
                let members: Vec<usize> = batch
                    .iter()
                    .map(|(j, _)| {
                        runs[*j].2 = None;
                        runs[*j].0
                    })
                    .collect();
                fail_all(sessions, &members, e.into(), &mut results);
            }
        }
    }
    // Commit every block, then decode.
    let mut denoised = Vec::new();
    for (i, n, run) in runs {
        let Some(run) = run else { continue };
        let _inside = sessions[i].enter_span();
        match sessions[i].finish_block(run) {
            Ok(block) => denoised.push((i, n, block)),
            Err(e) => results[i] = Some(settled(sessions[i], e)),
        }
    }
    if !denoised.is_empty() {
        let platform = dit.device().platform().clone();
        phases::denoise_end(platform.as_ref());
        let stats = platform.memory_stats();
        // The round's decode is a span of its own: the denoise's arena goes back before
        // the decode's is taken, while what the decode leaves for later (each session's
        // decoder state, its frames) grows on the caching path.
        drop(in_round.take());
        if let (Some(id), Some(key)) = (round_span.take(), round_key.as_deref()) {
            leave_round(&allocator, id, sessions);
            let members: Vec<usize> = denoised.iter().map(|&(i, ..)| i).collect();
            round_span = enter_round(&allocator, &decode_key(key), sessions, &members);
            in_round = round_span.map(|id| allocator.enter_span(Some(id)));
        }
        decode(sessions, denoised, &stats, &mut results);
    }
    drop(in_round);
    if let Some(id) = round_span {
        leave_round(&allocator, id, sessions);
    }
    collect(results)
}

/// The key of the decode half of round `key`.
pub(crate) fn decode_key(key: &str) -> String {
    format!("{key} decode")
}

/// Opens the shared span `key` of a batched round and puts `members` (session indices)
/// in it; `None` where it cannot open (its arenas do not fit: the round runs on the
/// caching path).
fn enter_round(
    allocator: &CachingAllocator,
    key: &str,
    sessions: &mut [&mut Session],
    members: &[usize],
) -> Option<headroom_mem::SpanId> {
    let (id, _) = allocator.open_shared_span(key).ok()?;
    for &i in members {
        sessions[i].set_round(Some(id));
    }
    Some(id)
}

/// Takes every session out of round span `id` and closes it.
fn leave_round(
    allocator: &CachingAllocator,
    id: headroom_mem::SpanId,
    sessions: &mut [&mut Session],
) {
    for session in sessions.iter_mut() {
        session.set_round(None);
    }
    allocator.close_span(id);
}

/// Encodes the image conditions of the sessions about to start their blocks: one
/// batched encode per group of two or more at the same block, size and VAE (a session
/// alone encodes its own as its block begins). A group whose encode fails ends its
/// sessions, which leave `starts`.
fn encode_conditions(
    sessions: &mut [&mut Session],
    starts: &mut Vec<(usize, usize)>,
    results: &mut [Option<Result<Chunk>>],
) {
    let groups = group_by(starts.iter().filter_map(|&(i, n)| {
        let (_, vae, hw) = sessions[i].condition()?;
        Some(((n, hw, Arc::as_ptr(vae) as usize), i))
    }));
    let mut failed = Vec::new();
    for ((n, _, _), members) in groups {
        if members.len() < 2 {
            continue;
        }
        let Some(vae) = sessions[members[0]]
            .condition()
            .map(|(_, v, _)| Arc::clone(v))
        else {
            continue;
        };
        let encoded = {
            let mut conds: Vec<&mut ImageCondition> = sessions
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| members.contains(i))
                .filter_map(|(_, s)| s.condition().map(|(c, _, _)| c))
                .collect();
            ImageCondition::advance_batch(&mut conds, &vae, n)
        };
        if let Err(e) = encoded {
            fail_all(sessions, &members, e, results);
            failed.extend(members);
        }
    }
    starts.retain(|(i, _)| !failed.contains(i));
}

/// Decodes the denoised blocks: sessions whose latents have one shape, on one VAE, with
/// decoders at the same point (fresh or not) as one batch; a session alone through its
/// own decode.
fn decode(
    sessions: &mut [&mut Session],
    denoised: Vec<(usize, usize, Denoised)>,
    stats: &MemoryStats,
    results: &mut [Option<Result<Chunk>>],
) {
    let groups = group_by(denoised.into_iter().map(|(i, n, block)| {
        let (decoder, state) = sessions[i].decoder();
        let key = (
            block.x0.shape().to_vec(),
            state.chunks_decoded == 0,
            decoder.id(),
        );
        (key, (i, n, block))
    }));
    for (_, members) in groups {
        if let [_] = members[..] {
            for (i, n, block) in members {
                let _inside = sessions[i].enter_span();
                let chunk = sessions[i].decode_chunk(n, block, stats.clone());
                sessions[i].settle(&chunk);
                results[i] = Some(chunk);
            }
            continue;
        }
        let start = Instant::now();
        let mut inputs = Vec::with_capacity(members.len());
        for (i, n, block) in members {
            let _inside = sessions[i].enter_span();
            match sessions[i].decode_input(n, &block) {
                Ok(()) => inputs.push((i, n, block)),
                Err(e) => results[i] = Some(settled(sessions[i], e)),
            }
        }
        let Some(&(first, ..)) = inputs.first() else {
            continue;
        };
        let decoder = Arc::clone(sessions[first].decoder().0);
        let owners: Vec<usize> = inputs.iter().map(|(i, ..)| *i).collect();
        let decoded = {
            let zs: Vec<&Tensor> = inputs.iter().map(|(_, _, block)| &block.x0).collect();
            // Session order on both sides: `inputs` follows the sessions' order.
            let mut states: Vec<&mut StreamingDecodeState> = sessions
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| owners.contains(i))
                .map(|(_, s)| s.decoder().1)
                .collect();
            let control = phases::DecodeStart::on(zs[0].device().platform().as_ref());
            decoder.decode_streams(&zs, &mut states, OutputFormat::PlanarUint8, &control)
        };
        match decoded.and_then(|out| {
            out.ok_or_else(|| headroom_model::ModelError::input("decode", "no frames produced"))
        }) {
            Ok(pixels) => {
                for ((i, n, block), pixels) in inputs.into_iter().zip(pixels) {
                    let _inside = sessions[i].enter_span();
                    let chunk = frames_of(pixels).map(|frames| {
                        sessions[i].delivered(n, &block, frames, start.elapsed(), stats.clone())
                    });
                    sessions[i].settle(&chunk);
                    results[i] = Some(chunk);
                }
            }
            Err(e) => fail_all(sessions, &owners, e.into(), results),
        }
    }
}

/// `items` grouped by key, groups and members in the order they first appear.
fn group_by<K: PartialEq, T>(items: impl IntoIterator<Item = (K, T)>) -> Vec<(K, Vec<T>)> {
    let mut groups: Vec<(K, Vec<T>)> = Vec::new();
    for (key, item) in items {
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(item),
            None => groups.push((key, vec![item])),
        }
    }
    groups
}

/// Ends every session of `members` after a batched step they shared failed: the first
/// carries the cause itself, the others [`EngineError::Batch`].
fn fail_all(
    sessions: &mut [&mut Session],
    members: &[usize],
    e: EngineError,
    results: &mut [Option<Result<Chunk>>],
) {
    let cause = e.to_string();
    let mut first = Some(e);
    for &i in members {
        let e = first
            .take()
            .unwrap_or_else(|| EngineError::Batch(cause.clone()));
        results[i] = Some(settled(sessions[i], e));
    }
}

/// The error `e` as a session's result, after the session released what it held.
fn settled(session: &mut Session, e: EngineError) -> Result<Chunk> {
    let _inside = session.enter_span();
    let result = Err(e);
    session.settle(&result);
    result
}

fn collect(results: Vec<Option<Result<Chunk>>>) -> Vec<Result<Chunk>> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(EngineError::Internal("no chunk was run".into()))))
        .collect()
}
