//! The collectives' contracts, on the in-process backend.

use super::*;
use crate::Device;

fn run<F>(size: usize, f: F) -> Vec<Vec<f32>>
where
    F: Fn(&dyn Communicator, &Device) -> Tensor + Sync,
{
    let comms = InProcessGroup::ranks(size);
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || {
                    let device = Device::cpu().unwrap();
                    f(c.as_ref(), &device).to_f32_vec().unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn all_reduce_sums_and_all_gather_concatenates_in_rank_order() {
    let out = run(3, |c, d| {
        let t = Tensor::from_slice(&[c.rank() as f32, 1.0], &[2], d).unwrap();
        c.all_reduce_sum(&t).unwrap()
    });
    assert!(out.iter().all(|v| v == &vec![3.0, 3.0]));
    let out = run(2, |c, d| {
        let t = Tensor::from_slice(&[c.rank() as f32; 2], &[1, 2], d).unwrap();
        c.all_gather(&t, 0).unwrap()
    });
    assert!(out.iter().all(|v| v == &vec![0.0, 0.0, 1.0, 1.0]));
}

#[test]
fn all_gather_along_an_inner_axis_interleaves_rows_in_rank_order() {
    // Rank r holds [[10r, 10r+1], [10r+2, 10r+3]]; gathered along axis 1, each row holds
    // rank 0's columns, then rank 1's.
    let out = run(2, |c, d| {
        let r = 10.0 * c.rank() as f32;
        let t = Tensor::from_slice(&[r, r + 1.0, r + 2.0, r + 3.0], &[2, 2], d).unwrap();
        let g = c.all_gather(&t, 1).unwrap();
        assert_eq!(g.shape(), &[2, 4]);
        g
    });
    let want = vec![0.0, 1.0, 10.0, 11.0, 2.0, 3.0, 12.0, 13.0];
    assert!(out.iter().all(|v| v == &want), "{out:?}");
}

#[test]
fn all_to_all_moves_sequence_parts_to_head_parts_and_back() {
    // Rank r holds tokens [2r, 2r+1] of 4, with 2 heads each; after the exchange it
    // holds all 4 tokens of head r; the reverse exchange restores the input.
    let out = run(2, |c, d| {
        let r = c.rank();
        let values: Vec<f32> = (0..2)
            .flat_map(|l| (0..2).map(move |h| (10 * (2 * r + l) + h) as f32))
            .collect();
        let t = Tensor::from_slice(&values, &[1, 2, 2, 1], d).unwrap();
        let heads = c.all_to_all(&t, 2, 1).unwrap();
        assert_eq!(heads.shape(), &[1, 4, 1, 1]);
        let expect: Vec<f32> = (0..4).map(|l| (10 * l + r) as f32).collect();
        assert_eq!(heads.to_f32_vec().unwrap(), expect);
        let back = c.all_to_all(&heads, 1, 2).unwrap();
        assert_eq!(back.to_f32_vec().unwrap(), values);
        back
    });
    assert_eq!(out.len(), 2);
}

#[test]
fn byte_messages_broadcast_from_the_root_and_gather_in_rank_order() {
    let comms = InProcessGroup::ranks(3);
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mine = if c.rank() == 1 {
                        b"open".to_vec()
                    } else {
                        vec![]
                    };
                    let got = c.broadcast_bytes(1, mine).unwrap();
                    let all = c.all_gather_bytes(&[c.rank() as u8; 2]).unwrap();
                    (got, all)
                })
            })
            .collect();
        for h in handles {
            let (got, all) = h.join().unwrap();
            assert_eq!(got, b"open");
            assert_eq!(all, vec![vec![0, 0], vec![1, 1], vec![2, 2]]);
        }
    });
    assert!(comms[0].broadcast_bytes(3, Vec::new()).is_err());
}

#[test]
fn collectives_allocate_the_same_bytes_on_meta_and_host_devices() {
    // A plan (meta execution) predicts the host run's allocations byte for byte.
    let peaks = |meta: bool| {
        let comms = InProcessGroup::ranks(2);
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let d = if meta {
                            Device::sim(1 << 30).unwrap()
                        } else {
                            Device::cpu().unwrap()
                        };
                        let t = Tensor::zeros(&[1, 6, 4, 8], DType::F32, &d).unwrap();
                        d.platform().reset_peak_stats();
                        let a = c.all_to_all(&t, 2, 1).unwrap();
                        let b = c.all_gather(&a, 2).unwrap();
                        let s = c.all_reduce_sum(&b).unwrap();
                        drop((a, b, s));
                        let stats = d.platform().memory_stats();
                        (
                            stats.allocated_bytes.all().peak,
                            stats.allocation.all().allocated,
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(peaks(true), peaks(false));
}

#[test]
fn an_aborted_group_fails_its_collectives_instead_of_hanging() {
    let comms = InProcessGroup::ranks(2);
    let device = Device::cpu().unwrap();
    let t = Tensor::zeros(&[2], DType::F32, &device).unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| comms[0].all_reduce_sum(&t));
        // Rank 1 fails instead of joining the collective.
        comms[1].abort();
        let err = waiting.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("aborted"), "{err}");
    });
    assert!(comms[1].all_gather(&t, 0).is_err());
    assert!(comms[0].broadcast_bytes(0, vec![1]).is_err());
}
