//! Camera control (STEPWISE.md part A): WASD/IJKL keys integrated into camera-to-world
//! poses (OpenCV axes, f64), framewise relative poses with translation normalisation and
//! the previous-block anchor, and the ray embedding `[origin, direction]` on the pixel
//! grid folded s×s onto the latent grid (`[1, 6·s², L, h, w]`, s the VAE's spatial
//! factor: 8 and 384 channels for Wan's VAE, as LingBot has it).

use headroom_tensor::{DType, Device, Tensor};

use crate::error::{ModelError, Result};

mod interaction;

pub use interaction::{transition_frames, CameraUpdate, InteractionHandler, UpdateMode};

/// A 4×4 camera-to-world matrix, row-major, f64.
pub type Pose = [[f64; 4]; 4];

/// Translation per latent frame of a W/A/S/D key.
pub const STEP: f64 = 0.05;
/// Pitch per latent frame of I/K, degrees.
pub const PITCH_STEP_DEG: f64 = 4.0;
/// Yaw per latent frame of J/L, degrees.
pub const YAW_STEP_DEG: f64 = 6.0;
/// Cumulative pitch limit, degrees.
pub const PITCH_LIMIT_DEG: f64 = 85.0;

/// The identity pose.
pub fn identity() -> Pose {
    let mut p = [[0.0; 4]; 4];
    (0..4).for_each(|i| p[i][i] = 1.0);
    p
}

fn matmul(a: &Pose, b: &Pose) -> Pose {
    let mut out = [[0.0; 4]; 4];
    for i in 0..4 {
        for j in 0..4 {
            out[i][j] = (0..4).map(|k| a[i][k] * b[k][j]).sum();
        }
    }
    out
}

/// The rigid inverse `[Rᵀ, −Rᵀt]`.
pub fn rigid_inverse(p: &Pose) -> Pose {
    let mut out = identity();
    for i in 0..3 {
        for j in 0..3 {
            out[i][j] = p[j][i];
        }
        out[i][3] = -(0..3).map(|k| p[k][i] * p[k][3]).sum::<f64>();
    }
    out
}

fn rot_x(a: f64) -> Pose {
    let (s, c) = a.sin_cos();
    let mut r = identity();
    r[1][1] = c;
    r[1][2] = -s;
    r[2][1] = s;
    r[2][2] = c;
    r
}

fn rot_y(a: f64) -> Pose {
    let (s, c) = a.sin_cos();
    let mut r = identity();
    r[0][0] = c;
    r[0][2] = s;
    r[2][0] = -s;
    r[2][2] = c;
    r
}

/// One latent frame's key set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Keys {
    /// Forward.
    pub w: bool,
    /// Left.
    pub a: bool,
    /// Back.
    pub s: bool,
    /// Right.
    pub d: bool,
    /// Pitch up.
    pub i: bool,
    /// Yaw left.
    pub j: bool,
    /// Pitch down.
    pub k: bool,
    /// Yaw right.
    pub l: bool,
}

impl Keys {
    /// Parses a key set such as `"wd"` or `"w+d"` (case-insensitive; `+` joins keys;
    /// `-` or empty = no key).
    pub fn parse(s: &str) -> Result<Self> {
        let mut keys = Keys::default();
        for c in s.chars().map(|c| c.to_ascii_lowercase()) {
            match c {
                'w' => keys.w = true,
                'a' => keys.a = true,
                's' => keys.s = true,
                'd' => keys.d = true,
                'i' => keys.i = true,
                'j' => keys.j = true,
                'k' => keys.k = true,
                'l' => keys.l = true,
                '-' | '.' | ' ' | '+' => {}
                other => {
                    return Err(ModelError::input(
                        "actions",
                        format!("unknown key {other:?}; use w, a, s, d (move), i, k (pitch), j, l (yaw), or - for none"),
                    ))
                }
            }
        }
        Ok(keys)
    }

    /// One key set per latent frame: each character is one frame (`"wwaa-d"`), and `+`
    /// joins the next key into the same frame (`"ww+dd"` is w, then w and d, then d).
    pub fn script(script: &str) -> Result<Vec<Self>> {
        let mut frames: Vec<String> = Vec::new();
        let mut join = false;
        for c in script.chars() {
            if c == '+' {
                if frames.is_empty() || join {
                    return Err(ModelError::input(
                        "actions",
                        format!("{script:?}: `+` joins two keys into one frame (e.g. w+d)"),
                    ));
                }
                join = true;
            } else if join {
                if let Some(last) = frames.last_mut() {
                    last.push(c);
                }
                join = false;
            } else {
                frames.push(c.to_string());
            }
        }
        if join {
            return Err(ModelError::input(
                "actions",
                format!("{script:?} ends in `+`; it joins two keys into one frame (e.g. w+d)"),
            ));
        }
        frames.iter().map(|f| Keys::parse(f)).collect()
    }
}

fn axis(a: bool, b: bool) -> f64 {
    f64::from(u8::from(a)) - f64::from(u8::from(b))
}

/// The WASD/IJKL integrator (STEPWISE A4): pose and pitch persist across blocks.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Controller {
    /// Current camera-to-world pose.
    pub pose: Pose,
    /// Cumulative pitch, radians.
    pub pitch: f64,
}

impl Default for Controller {
    fn default() -> Self {
        Self {
            pose: identity(),
            pitch: 0.0,
        }
    }
}

impl Controller {
    /// Applies one latent frame's keys and returns the pose after it.
    pub fn step(&mut self, keys: Keys) -> Pose {
        let mut dp = PITCH_STEP_DEG.to_radians() * axis(keys.i, keys.k);
        if (self.pitch + dp).abs() > PITCH_LIMIT_DEG.to_radians() {
            dp = 0.0; // the whole step is dropped, not clamped
        } else {
            self.pitch += dp;
        }
        let dy = YAW_STEP_DEG.to_radians() * axis(keys.l, keys.j);
        let mut r = self.pose;
        (0..3).for_each(|i| r[i][3] = 0.0);
        let r = matmul(&matmul(&rot_y(dy), &r), &rot_x(dp));
        let unit = |v: [f64; 3]| {
            let n = (v[0] * v[0] + v[2] * v[2]).sqrt();
            if n > 0.0 {
                [v[0] / (n + 1e-6), 0.0, v[2] / (n + 1e-6)]
            } else {
                v
            }
        };
        let fwd = unit([r[0][2], 0.0, r[2][2]]);
        let rgt = unit([r[0][0], 0.0, r[2][0]]);
        let (mw, md) = (STEP * axis(keys.w, keys.s), STEP * axis(keys.d, keys.a));
        let mut p = r;
        for i in 0..3 {
            p[i][3] = self.pose[i][3] + mw * fwd[i] + md * rgt[i];
        }
        p[3] = [0.0, 0.0, 0.0, 1.0];
        self.pose = p;
        p
    }
}

/// Framewise deltas `D_0 = I, D_i = inv(P_{i−1})·P_i`, translations divided by `scale`
/// (`None`: the largest delta translation, if non-zero).
pub fn framewise_deltas(poses: &[Pose], scale: Option<f64>) -> Vec<Pose> {
    let mut deltas: Vec<Pose> = (0..poses.len())
        .map(|i| {
            if i == 0 {
                identity()
            } else {
                matmul(&rigid_inverse(&poses[i - 1]), &poses[i])
            }
        })
        .collect();
    let norm = |d: &Pose| (d[0][3] * d[0][3] + d[1][3] * d[1][3] + d[2][3] * d[2][3]).sqrt();
    let scale = scale.unwrap_or_else(|| deltas.iter().map(norm).fold(0.0, f64::max));
    if scale > 0.0 {
        for d in &mut deltas {
            (0..3).for_each(|i| d[i][3] /= scale);
        }
    }
    deltas
}

/// Ray embedding of framewise poses on an `height × width` pixel grid with intrinsics
/// `[fx, fy, cx, cy]` (one for all frames, or one per frame), folded `s×s` (`s` =
/// `fold`, the VAE's spatial factor): `[1, 6·s², L, height/s, width/s]`, channel
/// `c·s² + dy·s + dx` with `c` = origin xyz then direction xyz.
pub fn ray_embedding(
    deltas: &[Pose],
    height: usize,
    width: usize,
    intrinsics: &[[f64; 4]],
    fold: usize,
    device: &Device,
) -> Result<Tensor> {
    if device.launcher().is_some() {
        // Built on the host, then one upload.
        let host = Device::cpu()?;
        let rays = ray_embedding(deltas, height, width, intrinsics, fold, &host)?;
        return Ok(rays.to_device(device)?);
    }
    if intrinsics.len() != 1 && intrinsics.len() != deltas.len() {
        return Err(ModelError::input(
            "camera",
            format!(
                "{} intrinsics for {} frames",
                intrinsics.len(),
                deltas.len()
            ),
        ));
    }
    let s = fold;
    if s == 0 || !height.is_multiple_of(s) || !width.is_multiple_of(s) || height == 0 || width == 0
    {
        return Err(ModelError::input(
            "camera",
            format!(
                "height and width must be positive multiples of the fold {s}, got {height}x{width}"
            ),
        ));
    }
    let (h, w, l) = (height / s, width / s, deltas.len());
    let mut tensor = Tensor::empty(&[1, 6 * s * s, l, h, w], DType::F32, device)?;
    let Some(out) = tensor.data_mut::<f32>() else {
        return Ok(tensor); // meta device: shapes only
    };
    for (f, d) in deltas.iter().enumerate() {
        let [fx, fy, cx, cy] = intrinsics[f.min(intrinsics.len() - 1)];
        for v in 0..height {
            for u in 0..width {
                let c = [(u as f64 + 0.5 - cx) / fx, (v as f64 + 0.5 - cy) / fy, 1.0];
                let n = (c[0] * c[0] + c[1] * c[1] + 1.0).sqrt();
                let c = [c[0] / n, c[1] / n, c[2] / n];
                let mut dir = [0.0; 3];
                for (i, di) in dir.iter_mut().enumerate() {
                    *di = (0..3).map(|k| d[i][k] * c[k]).sum();
                }
                let dn = (dir[0] * dir[0] + dir[1] * dir[1] + dir[2] * dir[2]).sqrt();
                let values = [
                    d[0][3],
                    d[1][3],
                    d[2][3],
                    dir[0] / dn,
                    dir[1] / dn,
                    dir[2] / dn,
                ];
                let (y, dy, x, dx) = (v / s, v % s, u / s, u % s);
                for (ch, value) in values.into_iter().enumerate() {
                    let channel = (ch * s + dy) * s + dx;
                    out[((channel * l + f) * h + y) * w + x] = value as f32;
                }
            }
        }
    }
    Ok(tensor)
}

/// An explicit camera trajectory: camera-to-world poses per pixel frame and intrinsics
/// `[fx, fy, cx, cy]` in 832×480 reference pixels (STEPWISE A3, A5).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Trajectory {
    /// `[F][4][4]` camera-to-world matrices (OpenCV axes).
    pub poses: Vec<Pose>,
    /// `[F][4]` intrinsics in reference units (default: 500/500 at the output size).
    #[serde(default)]
    pub intrinsics: Vec<[f64; 4]>,
}

fn slerp(a: [f64; 4], b: [f64; 4], t: f64) -> [f64; 4] {
    let mut dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let b = if dot < 0.0 {
        dot = -dot;
        b.map(|v| -v)
    } else {
        b
    };
    if dot > 0.9995 {
        return nlerp(a, b, t);
    }
    let theta = dot.acos();
    let (wa, wb) = (
        ((1.0 - t) * theta).sin() / theta.sin(),
        (t * theta).sin() / theta.sin(),
    );
    [0, 1, 2, 3].map(|i| wa * a[i] + wb * b[i])
}

impl Trajectory {
    /// Parses `{"poses": [...], "intrinsics": [...]}` and checks shapes and finiteness.
    pub fn from_json(text: &str) -> Result<Self> {
        let t: Trajectory = serde_json::from_str(text).map_err(|e| {
            ModelError::input(
                "camera trajectory",
                format!("not a {{poses, intrinsics}} JSON object: {e}"),
            )
        })?;
        Self::new(t.poses, t.intrinsics)
    }

    /// A trajectory of `poses` and `intrinsics` (one per pose, or none for the
    /// default), checked: at least one pose, matching counts, finite values.
    pub fn new(poses: Vec<Pose>, intrinsics: Vec<[f64; 4]>) -> Result<Self> {
        let t = Trajectory { poses, intrinsics };
        if t.poses.is_empty() {
            return Err(ModelError::input(
                "camera trajectory",
                "needs at least one pose",
            ));
        }
        if !t.intrinsics.is_empty() && t.intrinsics.len() != t.poses.len() {
            return Err(ModelError::input(
                "camera trajectory",
                format!(
                    "{} intrinsics for {} poses",
                    t.intrinsics.len(),
                    t.poses.len()
                ),
            ));
        }
        let finite = t
            .poses
            .iter()
            .flatten()
            .flatten()
            .chain(t.intrinsics.iter().flatten())
            .all(|v| v.is_finite());
        if !finite {
            return Err(ModelError::input(
                "camera trajectory",
                "values must be finite",
            ));
        }
        for (i, p) in t.poses.iter().enumerate() {
            if let Some(why) = not_rigid(p) {
                return Err(ModelError::input(
                    "camera trajectory",
                    format!("pose {i} is not a camera-to-world rigid transform: {why}"),
                ));
            }
        }
        Ok(t)
    }

    /// One pose and one set of intrinsics (scaled to `width × height`) per latent frame:
    /// latent `i` samples pixel time `i·(N−1)/(L−1)`, translations and intrinsics linearly,
    /// rotations by slerp.
    pub fn sample(
        &self,
        latent_frames: usize,
        pixel_frames: usize,
        width: usize,
        height: usize,
    ) -> Result<(Vec<Pose>, Vec<[f64; 4]>)> {
        let f = self.poses.len();
        if f != 1 && f != pixel_frames {
            return Err(ModelError::input(
                "camera trajectory",
                format!("{f} poses for {pixel_frames} frames (need exactly one per frame, or exactly one)"),
            ));
        }
        let (sx, sy) = (width as f64 / 832.0, height as f64 / 480.0);
        let reference = [500.0 / sx, 500.0 / sy, 416.0, 240.0];
        let intrinsic = |i: usize| self.intrinsics.get(i).copied().unwrap_or(reference);
        let mut poses = Vec::with_capacity(latent_frames);
        let mut ks = Vec::with_capacity(latent_frames);
        for i in 0..latent_frames {
            let s = if f == 1 || latent_frames == 1 {
                0.0
            } else {
                i as f64 / (latent_frames - 1) as f64 * (pixel_frames - 1) as f64
            };
            let lo = (s.floor() as usize).min(f - 1);
            let hi = (lo + 1).min(f - 1);
            let a = s - lo as f64;
            let (p, q) = (&self.poses[lo], &self.poses[hi]);
            let t = [0, 1, 2].map(|r| p[r][3] + (q[r][3] - p[r][3]) * a);
            poses.push(pose_from(t, slerp(quaternion_of(p), quaternion_of(q), a)));
            let (kl, kh) = (intrinsic(lo), intrinsic(hi));
            let k = [0, 1, 2, 3].map(|j| kl[j] + (kh[j] - kl[j]) * a);
            ks.push([k[0] * sx, k[1] * sy, k[2] * sx, k[3] * sy]);
        }
        Ok((poses, ks))
    }
}

/// Why `p` is not a rigid transform (rotation, translation, last row `0 0 0 1`), if it
/// is not: a singular or scaled matrix would turn into a meaningless camera.
fn not_rigid(p: &Pose) -> Option<String> {
    let last = p[3];
    if last[..3].iter().any(|v| v.abs() > 1e-6) || (last[3] - 1.0).abs() > 1e-6 {
        return Some(format!("its last row is {last:?}, not [0, 0, 0, 1]"));
    }
    let r = |a: usize, b: usize| p[a][b];
    let det = r(0, 0) * (r(1, 1) * r(2, 2) - r(1, 2) * r(2, 1))
        - r(0, 1) * (r(1, 0) * r(2, 2) - r(1, 2) * r(2, 0))
        + r(0, 2) * (r(1, 0) * r(2, 1) - r(1, 1) * r(2, 0));
    if det.abs() < 1e-6 {
        return Some("its rotation part is singular (determinant 0)".into());
    }
    // RᵀR = I within what float32 storage and slerp rounding leave.
    for a in 0..3 {
        for b in 0..3 {
            let dot: f64 = (0..3).map(|k| r(k, a) * r(k, b)).sum();
            let want = if a == b { 1.0 } else { 0.0 };
            if (dot - want).abs() > 1e-2 {
                return Some(format!(
                    "its rotation part is not orthonormal (columns {a}·{b} = {dot:.4}, want {want}; determinant {det:.4})"
                ));
            }
        }
    }
    None
}

/// Default intrinsics at `width × height`: `fx = fy = 500`, centre at the middle.
pub fn default_intrinsics(width: usize, height: usize) -> [f64; 4] {
    [500.0, 500.0, width as f64 / 2.0, height as f64 / 2.0]
}

fn pose_from(t: [f64; 3], q: [f64; 4]) -> Pose {
    let [x, y, z, w] = q;
    let mut p = identity();
    p[0][0] = 1.0 - 2.0 * (y * y + z * z);
    p[0][1] = 2.0 * (x * y - z * w);
    p[0][2] = 2.0 * (x * z + y * w);
    p[1][0] = 2.0 * (x * y + z * w);
    p[1][1] = 1.0 - 2.0 * (x * x + z * z);
    p[1][2] = 2.0 * (y * z - x * w);
    p[2][0] = 2.0 * (x * z - y * w);
    p[2][1] = 2.0 * (y * z + x * w);
    p[2][2] = 1.0 - 2.0 * (x * x + y * y);
    (0..3).for_each(|i| p[i][3] = t[i]);
    p
}

/// The rotation of a pose as a unit quaternion `[x, y, z, w]`.
fn quaternion_of(p: &Pose) -> [f64; 4] {
    let trace = p[0][0] + p[1][1] + p[2][2];
    let q = if trace > 0.0 {
        let s = (trace + 1.0).sqrt() * 2.0;
        [
            (p[2][1] - p[1][2]) / s,
            (p[0][2] - p[2][0]) / s,
            (p[1][0] - p[0][1]) / s,
            0.25 * s,
        ]
    } else if p[0][0] > p[1][1] && p[0][0] > p[2][2] {
        let s = (1.0 + p[0][0] - p[1][1] - p[2][2]).sqrt() * 2.0;
        [
            0.25 * s,
            (p[0][1] + p[1][0]) / s,
            (p[0][2] + p[2][0]) / s,
            (p[2][1] - p[1][2]) / s,
        ]
    } else if p[1][1] > p[2][2] {
        let s = (1.0 + p[1][1] - p[0][0] - p[2][2]).sqrt() * 2.0;
        [
            (p[0][1] + p[1][0]) / s,
            0.25 * s,
            (p[1][2] + p[2][1]) / s,
            (p[0][2] - p[2][0]) / s,
        ]
    } else {
        let s = (1.0 + p[2][2] - p[0][0] - p[1][1]).sqrt() * 2.0;
        [
            (p[0][2] + p[2][0]) / s,
            (p[1][2] + p[2][1]) / s,
            0.25 * s,
            (p[1][0] - p[0][1]) / s,
        ]
    };
    let n = q.iter().map(|v| v * v).sum::<f64>().sqrt();
    q.map(|v| v / n)
}

/// Shortest-path normalised linear interpolation of unit quaternions.
fn nlerp(a: [f64; 4], b: [f64; 4], t: f64) -> [f64; 4] {
    let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let sign = if dot < 0.0 { -1.0 } else { 1.0 };
    let q: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| x * (1.0 - t) + sign * y * t)
        .collect();
    let n = q.iter().map(|v| v * v).sum::<f64>().sqrt();
    [q[0] / n, q[1] / n, q[2] / n, q[3] / n]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn w_moves_forward_along_z_and_d_moves_right_along_x() {
        let mut c = Controller::default();
        let p = c.step(Keys::parse("w").unwrap());
        assert!(close(p[2][3], STEP / (1.0 + 1e-6)) && close(p[0][3], 0.0));
        let p = c.step(Keys::parse("d").unwrap());
        assert!(close(p[0][3], STEP / (1.0 + 1e-6)));
        let p = c.step(Keys::parse("ws").unwrap());
        assert!(close(p[2][3], STEP / (1.0 + 1e-6)), "opposing keys cancel");
    }

    #[test]
    fn l_yaws_the_forward_axis_toward_plus_x_and_i_tilts_it_image_up() {
        let mut c = Controller::default();
        let p = c.step(Keys::parse("l").unwrap());
        assert!(p[0][2] > 0.0 && close(p[0][2], 6f64.to_radians().sin()));
        let mut c = Controller::default();
        let p = c.step(Keys::parse("i").unwrap());
        assert!(p[1][2] < 0.0, "forward tilts toward −y (image up)");
    }

    #[test]
    fn pitch_stops_at_85_degrees_dropping_the_whole_step() {
        let mut c = Controller::default();
        for _ in 0..30 {
            c.step(Keys::parse("i").unwrap());
        }
        assert!(
            close(c.pitch, 84f64.to_radians()),
            "{}",
            c.pitch.to_degrees()
        );
    }

    #[test]
    fn deltas_are_relative_and_normalised_by_the_largest_step() {
        let mut c = Controller::default();
        let poses: Vec<Pose> = std::iter::once(identity())
            .chain(
                ["w", "wd", "-"]
                    .iter()
                    .map(|k| c.step(Keys::parse(k).unwrap())),
            )
            .collect();
        let d = framewise_deltas(&poses, None);
        assert_eq!(d[0], identity());
        let norm = |p: &Pose| (p[0][3].powi(2) + p[1][3].powi(2) + p[2][3].powi(2)).sqrt();
        assert!(close(norm(&d[2]), 1.0));
        assert!(norm(&d[1]) < 1.0 && close(norm(&d[3]), 0.0));
        let fixed = framewise_deltas(&poses, Some(STEP));
        assert!((norm(&fixed[1]) - 1.0).abs() < 1e-5);
    }

    #[test]
    fn identity_rays_look_along_z_and_fold_like_pixel_unshuffle() {
        let dev = Device::cpu().unwrap();
        let k = [[500.0, 500.0, 8.0, 8.0]];
        let e = ray_embedding(&[identity()], 16, 16, &k, 8, &dev).unwrap();
        assert_eq!(e.shape(), [1, 384, 1, 2, 2]);
        let v = e.to_vec::<f32>().unwrap();
        // Direction z ≈ 1 everywhere; origin 0.
        for i in 0..4 * 64 {
            assert!(v[(5 * 64 * 4) + i] > 0.999);
            assert_eq!(v[i], 0.0);
        }
        // Direction x of pixel (u=0, v=0) sits at channel 3·64 + 0, cell (0, 0), and is negative.
        assert!(v[3 * 64 * 4] < 0.0);
        // Pixel (u=15, v=15): channel 3·64 + 7·8 + 7, cell (1, 1), positive.
        assert!(v[((3 * 64 + 63) * 2 + 1) * 2 + 1] > 0.0);
        assert!(ray_embedding(&[identity()], 12, 16, &[[1.0; 4]], 8, &dev).is_err());
        assert!(ray_embedding(&[identity()], 16, 16, &[[1.0; 4]], 0, &dev).is_err());
    }

    #[test]
    fn a_finer_fold_carries_the_same_rays_on_a_finer_grid() {
        // Folding 4×4 instead of 8×8: each pixel's six values move to channel
        // `c·16 + dy·4 + dx` of cell (v/4, u/4), and nothing else changes.
        let dev = Device::cpu().unwrap();
        let mut c = Controller::default();
        let poses = [identity(), c.step(Keys::parse("wl").unwrap())];
        let d = framewise_deltas(&poses, None);
        let k = [[40.0, 40.0, 7.5, 8.5]];
        let coarse = ray_embedding(&d, 16, 24, &k, 8, &dev).unwrap();
        let fine = ray_embedding(&d, 16, 24, &k, 4, &dev).unwrap();
        assert_eq!(fine.shape(), [1, 96, 2, 4, 6]);
        let (a, b) = (
            coarse.to_vec::<f32>().unwrap(),
            fine.to_vec::<f32>().unwrap(),
        );
        for f in 0..2 {
            for v in 0..16 {
                for u in 0..24 {
                    for ch in 0..6 {
                        let at8 =
                            ((((ch * 8 + v % 8) * 8 + u % 8) * 2 + f) * 2 + v / 8) * 3 + u / 8;
                        let at4 =
                            ((((ch * 4 + v % 4) * 4 + u % 4) * 2 + f) * 4 + v / 4) * 6 + u / 4;
                        assert_eq!(a[at8], b[at4], "frame {f} pixel ({u}, {v}) channel {ch}");
                    }
                }
            }
        }
    }

    #[test]
    fn scripts_parse_one_key_set_per_frame_and_reject_unknown_keys() {
        assert_eq!(Keys::script("wA-").unwrap().len(), 3);
        let joined = Keys::script("ww+dd").unwrap();
        assert_eq!(joined.len(), 3);
        assert!(joined[1].w && joined[1].d && !joined[0].d && !joined[2].w);
        for bad in ["+w", "w+", "w++d"] {
            assert!(
                Keys::script(bad).unwrap_err().to_string().contains("joins"),
                "{bad}"
            );
        }
        assert!(Keys::script("wq").unwrap_err().to_string().contains("'q'"));
    }
}

#[cfg(test)]
mod trajectory_tests {
    use super::*;

    #[test]
    fn a_trajectory_samples_every_fourth_pixel_frame_and_scales_intrinsics() {
        let poses: Vec<Pose> = (0..9)
            .map(|i| {
                let mut p = identity();
                p[2][3] = i as f64;
                p
            })
            .collect();
        let t = Trajectory {
            poses,
            intrinsics: vec![],
        };
        let (sampled, ks) = t.sample(3, 9, 416, 240).unwrap();
        let z: Vec<f64> = sampled.iter().map(|p| p[2][3]).collect();
        assert_eq!(z, [0.0, 4.0, 8.0]);
        assert_eq!(ks[0], default_intrinsics(416, 240));
        assert!(t
            .sample(3, 13, 416, 240)
            .unwrap_err()
            .to_string()
            .contains("9 poses for 13 frames"));
        let json = r#"{"poses": [[[1,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]]], "intrinsics": [[500, 500, 416, 240]]}"#;
        let one = Trajectory::from_json(json).unwrap();
        assert_eq!(one.sample(3, 9, 832, 480).unwrap().0.len(), 3);
        assert!(Trajectory::from_json(r#"{"poses": []}"#).is_err());
    }

    #[test]
    fn rotations_interpolate_by_slerp() {
        let q0 = [0.0, 0.0, 0.0, 1.0];
        let q1 = [0.0, (0.5f64).sin(), 0.0, (0.5f64).cos()]; // 1 rad about y
        let mid = slerp(q0, q1, 0.5);
        assert!((mid[1] - (0.25f64).sin()).abs() < 1e-12);
    }
}
