//! Mid-session camera updates (STEPWISE A6, vllm-omni's `session.interaction`): a
//! target pose reached over some chunks, or a velocity applied every latent frame.

use super::{identity, matmul, nlerp, pose_from, quaternion_of, Pose};
use crate::error::{ModelError, Result};

/// How a mid-session camera update moves the camera (STEPWISE A6).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum UpdateMode {
    /// Move to an absolute pose (relative to the session start), over `transition_chunks`.
    Target,
    /// Apply a camera-local delta every latent frame until replaced.
    Velocity,
}

/// A `session.interaction` camera update: translation xyz and rotation quaternion xyzw,
/// passed through in the camera frame the model uses (vllm-omni's "Unity" label is
/// documentation only; no axes are converted).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CameraUpdate {
    /// Target or velocity.
    pub mode: UpdateMode,
    /// Translation.
    pub translation: [f64; 3],
    /// Rotation quaternion `[x, y, z, w]` (normalised on receipt).
    pub rotation: [f64; 4],
    /// Chunks a target move takes (≤ 0: snap).
    pub transition_chunks: f64,
}

impl CameraUpdate {
    /// The velocity a held key set means, as vLLM-Omni's client helper (and headroom's
    /// web viewer) sends it: translation `(STEP·(d−a), 0, STEP·(w−s))` and rotation
    /// `Rx(PITCH_STEP·(i−k)) ⊗ Ry(YAW_STEP·(l−j))`, every latent frame until replaced
    /// (no key: the camera stands still).
    pub fn from_keys(keys: super::Keys) -> Self {
        let axis = |a: bool, b: bool| f64::from(u8::from(a)) - f64::from(u8::from(b));
        let pitch = super::PITCH_STEP_DEG.to_radians() * axis(keys.i, keys.k);
        let yaw = super::YAW_STEP_DEG.to_radians() * axis(keys.l, keys.j);
        let [x1, w1] = [(pitch / 2.0).sin(), (pitch / 2.0).cos()];
        let [y2, w2] = [(yaw / 2.0).sin(), (yaw / 2.0).cos()];
        // (x1, 0, 0, w1) ⊗ (0, y2, 0, w2), written out.
        let rotation = [x1 * w2, w1 * y2, x1 * y2, w1 * w2];
        Self {
            mode: UpdateMode::Velocity,
            translation: [
                super::STEP * axis(keys.d, keys.a),
                0.0,
                super::STEP * axis(keys.w, keys.s),
            ],
            rotation,
            transition_chunks: 0.0,
        }
    }

    /// Checks finiteness and normalises the quaternion.
    pub fn validated(mut self) -> Result<Self> {
        let finite = self
            .translation
            .iter()
            .chain(&self.rotation)
            .all(|v| v.is_finite())
            && self.transition_chunks.is_finite();
        let norm = self.rotation.iter().map(|v| v * v).sum::<f64>().sqrt();
        if !finite || norm == 0.0 {
            return Err(ModelError::input(
                "camera",
                "translation, rotation and transition_chunks must be finite, rotation non-zero",
            ));
        }
        self.rotation.iter_mut().for_each(|v| *v /= norm);
        Ok(self)
    }

    fn pose(&self) -> Pose {
        pose_from(self.translation, self.rotation)
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct ActiveUpdate {
    update: CameraUpdate,
    source: Pose,
    steps: u64,
}

/// Applies mid-session camera updates at chunk boundaries, one pose per latent frame
/// (STEPWISE A6, the latent-frame version). It serialises whole (pose, the active
/// update and where it stands, pending updates), so a saved session resumes mid-move.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct InteractionHandler {
    pose: Pose,
    active: Option<ActiveUpdate>,
    /// Updates for the next chunk, each with the latent frame of it it starts at.
    pending: Vec<(CameraUpdate, usize)>,
}

impl Default for InteractionHandler {
    fn default() -> Self {
        Self {
            pose: identity(),
            active: None,
            pending: Vec::new(),
        }
    }
}

impl InteractionHandler {
    /// Queues an update for the next chunk boundary.
    pub fn queue(&mut self, update: CameraUpdate) -> Result<()> {
        self.queue_at(update, 0)
    }

    /// Queues an update that starts at latent frame `frame` of the next chunk (past its
    /// end: at its last frame).
    pub fn queue_at(&mut self, update: CameraUpdate, frame: usize) -> Result<()> {
        self.pending.push((update.validated()?, frame));
        Ok(())
    }

    /// The current absolute pose.
    pub fn pose(&self) -> Pose {
        self.pose
    }

    /// The next chunk's `frames` poses: each queued update activates at its frame (a
    /// newer one replaces an older, from where the camera is then), and every frame
    /// steps the active update.
    pub fn step_chunk(&mut self, frames: usize) -> Vec<Pose> {
        let mut pending = std::mem::take(&mut self.pending);
        let last = frames.saturating_sub(1);
        (0..frames)
            .map(|j| {
                for (update, _) in pending.iter().filter(|(_, f)| (*f).min(last) == j) {
                    self.active = Some(ActiveUpdate {
                        update: *update,
                        source: self.pose,
                        steps: 0,
                    });
                }
                pending.retain(|(_, f)| (*f).min(last) != j);
                self.step()
            })
            .collect()
    }

    fn step(&mut self) -> Pose {
        let Some(active) = self.active.as_mut() else {
            return self.pose;
        };
        match active.update.mode {
            UpdateMode::Velocity => {
                self.pose = matmul(&self.pose, &active.update.pose());
            }
            UpdateMode::Target => {
                let target = active.update.pose();
                let d = active.update.transition_chunks;
                if d <= 0.0 {
                    self.pose = target;
                    self.active = None;
                } else {
                    let total = transition_frames(d) as u64;
                    active.steps += 1;
                    let a = (active.steps as f64 / total as f64).min(1.0);
                    let s = active.source;
                    let t = [0, 1, 2].map(|i| s[i][3] + (target[i][3] - s[i][3]) * a);
                    self.pose = pose_from(t, nlerp(quaternion_of(&s), quaternion_of(&target), a));
                    if active.steps >= total {
                        self.pose = target;
                        self.active = None;
                    }
                }
            }
        }
        self.pose
    }
}

/// Latent frames a transition of `chunks` chunks spans, `max(1, round(3·chunks))` (3
/// latent frames a chunk, vLLM-Omni's rule for camera targets and prompt blends); 0 for
/// `chunks ≤ 0`: at once.
pub fn transition_frames(chunks: f64) -> usize {
    if chunks.is_finite() && chunks > 0.0 {
        ((chunks * 3.0).round() as usize).max(1)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(mode: UpdateMode, t: [f64; 3], q: [f64; 4], chunks: f64) -> CameraUpdate {
        CameraUpdate {
            mode,
            translation: t,
            rotation: q,
            transition_chunks: chunks,
        }
    }

    #[test]
    fn a_velocity_of_005_held_for_one_chunk_moves_015() {
        let mut h = InteractionHandler::default();
        h.queue(update(
            UpdateMode::Velocity,
            [0.0, 0.0, 0.05],
            [0.0, 0.0, 0.0, 1.0],
            1.0,
        ))
        .unwrap();
        let poses = h.step_chunk(3);
        assert!((poses[2][2][3] - 0.15).abs() < 1e-12);
        let next = h.step_chunk(3);
        assert!(
            (next[2][2][3] - 0.30).abs() < 1e-12,
            "velocity persists until replaced"
        );
    }

    #[test]
    fn a_target_is_reached_over_its_transition_and_snaps_without_one() {
        let mut h = InteractionHandler::default();
        h.queue(update(
            UpdateMode::Target,
            [3.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 1.0],
            1.0,
        ))
        .unwrap();
        let poses = h.step_chunk(3);
        let xs: Vec<f64> = poses.iter().map(|p| p[0][3]).collect();
        assert!(
            (xs[0] - 1.0).abs() < 1e-12
                && (xs[1] - 2.0).abs() < 1e-12
                && (xs[2] - 3.0).abs() < 1e-12
        );
        let half_turn = [
            0.0,
            (std::f64::consts::FRAC_PI_4).sin(),
            0.0,
            (std::f64::consts::FRAC_PI_4).cos(),
        ];
        h.queue(update(UpdateMode::Target, [0.0; 3], half_turn, 0.0))
            .unwrap();
        let p = h.step_chunk(1)[0];
        assert!(
            (p[0][2] - 1.0).abs() < 1e-9 && p[0][3].abs() < 1e-12,
            "90° about y, snapped"
        );
        assert!(h
            .queue(update(
                UpdateMode::Target,
                [f64::NAN, 0.0, 0.0],
                [0.0, 0.0, 0.0, 1.0],
                0.0
            ))
            .is_err());
    }

    #[test]
    fn an_update_queued_at_a_frame_starts_there() {
        let velocity = update(
            UpdateMode::Velocity,
            [0.0, 0.0, 0.05],
            [0.0, 0.0, 0.0, 1.0],
            1.0,
        );
        let mut h = InteractionHandler::default();
        h.queue_at(velocity, 2).unwrap();
        let z: Vec<f64> = h.step_chunk(3).iter().map(|p| p[2][3]).collect();
        assert!(z[0].abs() < 1e-12 && z[1].abs() < 1e-12 && (z[2] - 0.05).abs() < 1e-12);
        // Past the chunk's end: its last frame.
        let mut h = InteractionHandler::default();
        h.queue_at(velocity, 9).unwrap();
        let z: Vec<f64> = h.step_chunk(3).iter().map(|p| p[2][3]).collect();
        assert!(z[1].abs() < 1e-12 && (z[2] - 0.05).abs() < 1e-12);
    }

    #[test]
    fn quaternions_round_trip_through_poses() {
        let q = [0.1, -0.3, 0.2, 0.9];
        let n = q.iter().map(|v: &f64| v * v).sum::<f64>().sqrt();
        let q = q.map(|v| v / n);
        let back = quaternion_of(&pose_from([0.0; 3], q));
        for (a, b) in q.iter().zip(back) {
            assert!((a - b).abs() < 1e-12);
        }
    }
}
