//! Interaction events through their lives, for the chunk metadata's
//! `started_event_ids`, `active_event_ids` and `completed_event_ids` (vLLM-Omni's rules).
//!
//! An event has up to two parts, each in its own lane: a camera update and a prompt.
//! In each lane a newer event replaces the active one, which completes at that
//! boundary. An event is active while any of its parts is, and completes with its last.
//! - **Camera:** a velocity stays active until replaced. A target moves over
//!   `max(1, round(3·transition_chunks))` latent frames from the latent frame it starts
//!   at (`min(3·frame / M, 2)` for video frame `frame` of an `M`-frame chunk), and
//!   completes with the chunk that holds its last one; `transition_chunks = 0` snaps.
//! - **Prompt:** the last prompt update before a boundary wins; the ones it replaced
//!   there complete at that boundary without starting. A started prompt blends over
//!   the same number of latent frames, a block (3 latent frames) per chunk, and
//!   completes with the chunk whose block finishes the blend.

use std::collections::VecDeque;

use headroom_model::camera::{transition_frames, UpdateMode};

/// Latent frames a chunk's block holds.
const BLOCK: usize = 3;

/// Which part of an event a lane tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Camera,
    Prompt,
}

/// The events under way and those completed since the last chunk.
#[derive(Debug, Default)]
pub struct EventTracker {
    /// (event id, lane, chunks left including the coming one; `None` until replaced).
    active: VecDeque<(String, Lane, Option<usize>)>,
    /// Parts completed at this boundary (replaced), by event id.
    ended: Vec<String>,
}

impl EventTracker {
    /// Ends the active part of `lane` (replaced by a newer event).
    fn replace(&mut self, lane: Lane) {
        let (gone, kept): (VecDeque<_>, VecDeque<_>) =
            self.active.drain(..).partition(|(_, l, _)| *l == lane);
        self.active = kept;
        self.ended.extend(gone.into_iter().map(|(id, _, _)| id));
    }

    /// A camera update of event `id` starts at video frame `frame` of the coming
    /// chunk of `chunk_frames` frames.
    pub fn camera(
        &mut self,
        id: &str,
        mode: UpdateMode,
        transition_chunks: f64,
        frame: usize,
        chunk_frames: usize,
    ) {
        self.replace(Lane::Camera);
        let latent = (BLOCK * frame / chunk_frames.max(1)).min(BLOCK - 1);
        let chunks = match mode {
            UpdateMode::Velocity => None,
            UpdateMode::Target => {
                let frames = transition_frames(transition_chunks).max(1);
                Some((latent + frames - 1) / BLOCK + 1)
            }
        };
        self.active
            .push_back((id.to_string(), Lane::Camera, chunks));
    }

    /// A prompt update of event `id` starts with the coming chunk, blending over
    /// `transition_chunks`.
    pub fn prompt(&mut self, id: &str, transition_chunks: f64) {
        self.replace(Lane::Prompt);
        let chunks = transition_frames(transition_chunks).div_ceil(BLOCK).max(1);
        self.active
            .push_back((id.to_string(), Lane::Prompt, Some(chunks)));
    }

    /// A prompt update of event `id` replaced before its boundary by a later one: it
    /// completes at this boundary.
    pub fn replaced(&mut self, id: &str) {
        self.ended.push(id.to_string());
    }

    /// Advances one chunk: (events still active after it, events completed during it).
    /// An event with a part still active is not completed.
    pub fn after_chunk(&mut self) -> (Vec<String>, Vec<String>) {
        let mut ended = std::mem::take(&mut self.ended);
        for (id, lane, left) in std::mem::take(&mut self.active) {
            match left {
                Some(1) => ended.push(id),
                Some(n) => self.active.push_back((id, lane, Some(n - 1))),
                None => self.active.push_back((id, lane, None)),
            }
        }
        let mut active: Vec<String> = Vec::new();
        for (id, _, _) in &self.active {
            if !active.contains(id) {
                active.push(id.clone());
            }
        }
        let mut completed: Vec<String> = Vec::new();
        for id in ended {
            if !active.contains(&id) && !completed.contains(&id) {
                completed.push(id);
            }
        }
        (active, completed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn a_new_camera_event_replaces_the_active_one_and_targets_complete_after_their_transition() {
        let mut t = EventTracker::default();
        t.camera("v", UpdateMode::Velocity, 1.0, 0, 12);
        assert_eq!(t.after_chunk(), (s(&["v"]), s(&[])));
        assert_eq!(t.after_chunk(), (s(&["v"]), s(&[])));
        t.camera("t", UpdateMode::Target, 2.0, 0, 12);
        assert_eq!(t.after_chunk(), (s(&["t"]), s(&["v"])));
        assert_eq!(t.after_chunk(), (s(&[]), s(&["t"])));
        t.camera("snap", UpdateMode::Target, 0.0, 5, 12);
        assert_eq!(t.after_chunk(), (s(&[]), s(&["snap"])));
    }

    #[test]
    fn a_target_counts_its_transition_from_the_latent_frame_it_starts_at() {
        // One chunk's transition (3 latent frames) from frame 0 ends in this chunk;
        // from frame 6 of 12 (latent 1) it ends in the next.
        let mut t = EventTracker::default();
        t.camera("early", UpdateMode::Target, 1.0, 0, 12);
        assert_eq!(t.after_chunk(), (s(&[]), s(&["early"])));
        t.camera("late", UpdateMode::Target, 1.0, 6, 12);
        assert_eq!(t.after_chunk(), (s(&["late"]), s(&[])));
        assert_eq!(t.after_chunk(), (s(&[]), s(&["late"])));
        // The last frame of a 9-frame chunk is latent 2.
        t.camera("last", UpdateMode::Target, 1.0, 8, 9);
        assert_eq!(t.after_chunk(), (s(&["last"]), s(&[])));
        assert_eq!(t.after_chunk(), (s(&[]), s(&["last"])));
    }

    #[test]
    fn prompts_blend_over_their_chunks_and_a_replaced_one_completes_at_the_boundary() {
        let mut t = EventTracker::default();
        // Two prompt updates before one boundary: the last wins.
        t.replaced("p1");
        t.prompt("p2", 3.0);
        assert_eq!(t.after_chunk(), (s(&["p2"]), s(&["p1"])));
        assert_eq!(t.after_chunk(), (s(&["p2"]), s(&[])));
        // A new prompt mid-blend replaces it at its boundary.
        t.prompt("p3", 0.0);
        assert_eq!(t.after_chunk(), (s(&[]), s(&["p2", "p3"])));
        // Lanes are independent: a camera velocity outlives a prompt.
        t.camera("v", UpdateMode::Velocity, 1.0, 0, 12);
        t.prompt("p4", 1.0);
        assert_eq!(t.after_chunk(), (s(&["v"]), s(&["p4"])));
    }

    #[test]
    fn an_event_with_both_parts_is_active_until_its_last_part_completes() {
        let mut t = EventTracker::default();
        t.camera("both", UpdateMode::Target, 1.0, 0, 12);
        t.prompt("both", 2.0);
        assert_eq!(t.after_chunk(), (s(&["both"]), s(&[])));
        assert_eq!(t.after_chunk(), (s(&[]), s(&["both"])));
    }
}
