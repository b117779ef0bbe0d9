//! A job's share of its instance.

/// The share of an instance a job holds: the larger of its CPU and memory fractions when both
/// the job's request and the instance's offer are known (as the simulator prices jobs), else the
/// slots it holds over the instance's slots; 1 when it takes the instance whole.
///
/// `request` and `offer` are `(cpu_millis, memory_bytes)`.
pub fn share_of(
    request: Option<(u64, u64)>,
    offer: Option<(u64, u64)>,
    slots: u32,
    capacity: u32,
    whole: bool,
) -> f64 {
    if whole {
        return 1.0;
    }
    let by_slots = f64::from(slots) / f64::from(capacity.max(1));
    let (Some((cpu, mem)), Some((ocpu, omem))) = (request, offer) else {
        return by_slots.min(1.0);
    };
    let frac = |want: u64, have: u64| {
        if have == 0 {
            0.0
        } else {
            want as f64 / have as f64
        }
    };
    let sized = frac(cpu, ocpu).max(frac(mem, omem));
    // A job that asks for nothing still holds its slots.
    let share = if sized > 0.0 { sized } else { by_slots };
    share.min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_larger_fraction_counts() {
        // 1 CPU, 8 GiB of a 4 CPU, 16 GiB instance: memory is the half it takes.
        let s = share_of(Some((1000, 8 * GIB)), Some((4000, 16 * GIB)), 1, 4, false);
        assert!((s - 0.5).abs() < 1e-9, "{s}");
    }

    #[test]
    fn without_sizes_the_slots_count_and_a_whole_instance_is_one() {
        assert!((share_of(None, None, 1, 4, false) - 0.25).abs() < 1e-9);
        assert!((share_of(None, Some((4000, GIB)), 2, 4, false) - 0.5).abs() < 1e-9);
        assert_eq!(
            share_of(Some((100, GIB)), Some((4000, GIB)), 1, 4, true),
            1.0
        );
        assert_eq!(share_of(Some((0, 0)), Some((4000, GIB)), 1, 2, false), 0.5);
        assert_eq!(
            share_of(Some((9000, GIB)), Some((4000, GIB)), 4, 4, false),
            1.0
        );
    }
}
