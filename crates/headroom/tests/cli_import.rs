//! The checkpoints users download, through the real binary: `dit forward` and `vae
//! decode` on original layouts give diffusers' numbers, and `generate` makes the same
//! video bytes from an original Wan folder, its diffusers twin, and a Self-Forcing `.pt`
//! holding the same weights over the Wan folder.

mod common;
use common::{assert_ok, headroom};

use std::path::{Path, PathBuf};

use headroom_tensor::io::npy::read_npy;
use headroom_tensor::Device;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/import")
        .join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn assert_close(got: &Path, expected: &Path) {
    let dev = Device::cpu().unwrap();
    let (g, e) = (
        read_npy(got, &dev).unwrap(),
        read_npy(expected, &dev).unwrap(),
    );
    assert_eq!(g.shape(), e.shape());
    let (g, e) = (g.to_f32_vec().unwrap(), e.to_f32_vec().unwrap());
    let err = headroom_tensor::compare::scaled_abs_diff(&g, &e).unwrap();
    assert!(err <= 1e-4, "max abs error over scale {err}");
}

#[test]
fn dit_forward_and_vae_decode_read_original_layouts_with_diffusers_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("v.npy");
    let (latents, text) = (fixture("latents.npy"), fixture("text.npy"));
    for (model, config) in [
        (fixture("wan"), None),
        (
            fixture("comfy.safetensors"),
            Some(fixture("wan/config.json")),
        ),
    ] {
        let mut args = vec![
            "dit",
            "forward",
            "--model",
            s(&model),
            "--latents",
            s(&latents),
            "--timestep",
            "937.5",
            "--text-embeds",
            s(&text),
            "--out",
            s(&out),
        ];
        let config = config.map(|c| c.display().to_string());
        if let Some(c) = &config {
            args.extend(["--config", c]);
        }
        assert_ok(&headroom(&args));
        assert_close(&out, &fixture("dit_out.npy"));
    }
    let res = headroom(&[
        "vae",
        "decode",
        "--model",
        s(&fixture("wan/Wan2.1_VAE.pth")),
        "--latents",
        s(&fixture("vae_latents.npy")),
        "--out",
        s(&out),
    ]);
    assert_ok(&res);
    assert_close(&out, &fixture("vae_decoded.npy"));
}

#[test]
fn a_wan_folder_its_diffusers_twin_and_a_self_forcing_pt_make_identical_videos() {
    let tmp = tempfile::tempdir().unwrap();
    let mut videos = Vec::new();
    for (i, (model, transformer)) in [
        (fixture("wan"), None),
        (fixture("diffusers"), None),
        (fixture("wan"), Some(fixture("self_forcing.pt"))),
    ]
    .into_iter()
    .enumerate()
    {
        let out = tmp.path().join(format!("{i}.y4m"));
        let mut args = vec![
            "generate",
            "--model",
            s(&model),
            "--frames",
            "21",
            "--width",
            "32",
            "--height",
            "32",
            "--out",
            s(&out),
        ];
        let transformer = transformer.map(|t| t.display().to_string());
        if let Some(t) = &transformer {
            args.extend(["--transformer", t]);
        }
        assert_ok(&headroom(&args));
        videos.push(std::fs::read(&out).unwrap());
    }
    assert!(videos[0].len() > 1000);
    assert!(
        videos[0] == videos[1],
        "Wan folder and diffusers twin differ"
    );
    assert!(
        videos[0] == videos[2],
        "the Self-Forcing generator_ema run differs"
    );
}

#[test]
fn a_checkpoint_that_asks_to_run_code_is_refused_naming_the_global() {
    // A torch-style zip whose data.pkl calls os.system: GLOBAL 'os system', a string,
    // TUPLE1, REDUCE. Written by hand so no Python is needed.
    let pickle = b"\x80\x02cos\nsystem\nX\x0a\x00\x00\x00echo pwned\x85R.";
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("evil.pt");
    std::fs::write(&path, stored_zip(&[("evil/data.pkl", pickle)])).unwrap();
    let res = headroom(&[
        "dit",
        "forward",
        "--model",
        s(&path),
        "--latents",
        s(&fixture("latents.npy")),
        "--timestep",
        "1",
        "--out",
        s(&tmp.path().join("o.npy")),
    ]);
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(
        err.contains("os.system") && err.contains("not allowed"),
        "{err}"
    );
}

/// A minimal stored zip (local headers, central directory, end record).
fn stored_zip(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, data) in entries {
        let offset = out.len() as u32;
        let sizes = [
            (data.len() as u32).to_le_bytes(),
            (data.len() as u32).to_le_bytes(),
        ]
        .concat();
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&sizes);
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        central.extend_from_slice(&sizes);
        central.extend_from_slice(&(name.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0; 12]);
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let cd = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

#[test]
fn lingbot_poses_and_intrinsics_npy_drive_the_camera_like_the_same_json_trajectory() {
    use headroom_tensor::io::npy::write_npy;
    use headroom_tensor::Tensor;
    let dev = Device::cpu().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cam");
    std::fs::create_dir(&dir).unwrap();
    let frames = 9;
    let (mut poses, mut json_poses) = (Vec::new(), Vec::new());
    for f in 0..frames {
        let z = 0.1 * f as f32;
        let m = [
            1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, z, 0.0, 0.0, 0.0, 1.0,
        ];
        poses.extend(m);
        json_poses.push(format!("[[1,0,0,0],[0,1,0,0],[0,0,1,{z}],[0,0,0,1]]"));
    }
    let intrinsics = [500f32, 500.0, 416.0, 240.0].repeat(frames);
    write_npy(
        dir.join("poses.npy"),
        &Tensor::from_slice(&poses, &[frames, 4, 4], &dev).unwrap(),
    )
    .unwrap();
    write_npy(
        dir.join("intrinsics.npy"),
        &Tensor::from_slice(&intrinsics, &[frames, 4], &dev).unwrap(),
    )
    .unwrap();
    let json = tmp.path().join("cam.json");
    let k = vec!["[500,500,416,240]"; frames].join(",");
    std::fs::write(
        &json,
        format!(
            "{{\"poses\": [{}], \"intrinsics\": [{k}]}}",
            json_poses.join(",")
        ),
    )
    .unwrap();
    let mut videos = Vec::new();
    for (i, actions) in [dir, json].iter().enumerate() {
        let out = tmp.path().join(format!("{i}.y4m"));
        assert_ok(&headroom(&[
            "generate",
            "--model",
            "tiny",
            "--frames",
            "9",
            "--width",
            "32",
            "--height",
            "32",
            "--actions",
            s(actions),
            "--out",
            s(&out),
        ]));
        videos.push(std::fs::read(&out).unwrap());
    }
    assert!(videos[0] == videos[1]);
    // And the camera matters: without it the video differs.
    let out = tmp.path().join("still.y4m");
    assert_ok(&headroom(&[
        "generate",
        "--model",
        "tiny",
        "--frames",
        "9",
        "--width",
        "32",
        "--height",
        "32",
        "--out",
        s(&out),
    ]));
    assert!(std::fs::read(&out).unwrap() != videos[0]);
}
