use gstore_store::{Store, StoreLocation};
use std::time::Instant;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let t = Instant::now();
    let store = Store::open_indexed(&StoreLocation::parse(&a[1]).unwrap(), &|m| eprintln!("{m}")).unwrap();
    println!("open {:.3}", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let id = store.resolve(&a[2]).unwrap();
    let m = store.get_manifest(&id).unwrap();
    println!("manifest {:.3}", t.elapsed().as_secs_f64());
    for _ in 0..3 {
        let t = Instant::now();
        let ids: Vec<_> = m.files().flat_map(|(_, c)| c.iter().map(|c| c.id)).collect();
        println!("ids {} {:.3}", ids.len(), t.elapsed().as_secs_f64());
        let t = Instant::now();
        use rayon::prelude::*;
        let n = ids.par_iter().filter(|id| store.locate(id).unwrap().is_some()).count();
        println!("locate {n} {:.3}", t.elapsed().as_secs_f64());
        let t = Instant::now();
        let p = gstore_restore::plan::plan(&store, &m, 16 << 20).unwrap();
        println!("plan {} reads {:.3}", p.reads.len(), t.elapsed().as_secs_f64());
    }
}
