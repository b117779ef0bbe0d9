//! Fitting jobs of several slots onto instances: first-fit decreasing.
//!
//! The scale decision counts slots; a job holding several slots of one instance also needs
//! them on the same instance, which a slot count cannot see (three instances with one free
//! slot each cannot take a three-slot job). This module answers how many new instances the
//! pending multi-slot jobs need after using the free room instances already have.

/// New instances of `per_instance` slots needed to place every request in `requests` (slots
/// per job), after placing what fits into `free` (free slots per existing instance).
pub fn instances_needed(requests: &[u32], free: &[u32], per_instance: u32) -> u32 {
    let mut sizes: Vec<u32> = requests.to_vec();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let mut bins: Vec<u32> = free.to_vec();
    let mut new = 0u32;
    for size in sizes {
        if let Some(bin) = bins.iter_mut().find(|b| **b >= size) {
            *bin -= size;
        } else if size <= per_instance {
            new += 1;
            bins.push(per_instance - size);
        }
        // A request larger than an instance was refused at reservation; never counted.
    }
    new
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scattered_free_slots_do_not_hold_a_large_job() {
        assert_eq!(instances_needed(&[3], &[1, 1, 1], 4), 1);
        assert_eq!(instances_needed(&[3], &[1, 3], 4), 0);
    }

    #[test]
    fn packs_largest_first() {
        // 3+1 and 2+2 fill two new instances exactly.
        assert_eq!(instances_needed(&[1, 2, 3, 2], &[], 4), 2);
        assert_eq!(instances_needed(&[4, 4, 4], &[4], 4), 2);
        assert_eq!(instances_needed(&[], &[], 4), 0);
    }
}
