//! Simulations side by side: independent runs on the machine's cores.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `f` over `items` on up to `threads` threads, each taking the next item
/// when it is done (runs differ widely in length), the results in the
/// items' order — the same on every machine whatever the thread count.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            s.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(k) else { break };
                    let r = f(item);
                    *slots[k].lock().expect("not poisoned") = Some(r);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .expect("not poisoned")
                .expect("every item was mapped")
        })
        .collect()
}

/// Threads to use by default: every core.
pub fn all_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_in_the_items_order_on_any_thread_count() {
        let items: Vec<u64> = (0..50).collect();
        for threads in [0, 1, 3, 64] {
            let got = parallel_map(&items, threads, |&x| x * x);
            assert_eq!(got, items.iter().map(|x| x * x).collect::<Vec<_>>());
        }
        assert!(parallel_map(&[] as &[u8], 4, |&x| x).is_empty());
    }
}
