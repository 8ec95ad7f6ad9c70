//! A minimal reader for the CRIU image files a page server needs: the process tree
//! (`pstree.img`), each process's memory areas (`mm-<pid>.img`) and its page map
//! (`pagemap-<pid>.img`). Framing: two u32 magics, then (u32 length, proto2 message) records.
//! Only the fields gstore uses are decoded; unknown fields are skipped.

/// A page: 4 KiB (x86-64, the only architecture gstore restores processes on).
pub const PAGE_SIZE: u64 = 4096;
/// Every protobuf image starts with this magic (images version 2).
pub const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
/// `pstree.img`.
pub const PSTREE_MAGIC: u32 = 0x5027_3030;
/// `mm-<pid>.img`.
pub const MM_MAGIC: u32 = 0x5749_2820;
/// `pagemap-<pid>.img`.
pub const PAGEMAP_MAGIC: u32 = 0x5608_4025;

/// `pagemap_entry.flags`: the bytes are in the parent image (incremental dumps).
pub const PE_PARENT: u32 = 1;
/// `pagemap_entry.flags`: the pages may be restored lazily (served over userfaultfd).
pub const PE_LAZY: u32 = 2;
/// `pagemap_entry.flags`: the bytes are in `pages-<pages_id>.img`.
pub const PE_PRESENT: u32 = 4;

/// One process of the image's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PstreeEntry {
    /// Its pid (the same after restore).
    pub pid: u32,
    /// Its threads' ids (the first is the pid itself).
    pub threads: Vec<u32>,
}

/// A memory area of a process: `[start, end)`, with CRIU's mmap flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vma {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// mmap(2) flags as dumped (MAP_PRIVATE, MAP_ANONYMOUS, ...).
    pub flags: u32,
}

/// One run of pages in a page map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagemapEntry {
    /// Address of the first page.
    pub vaddr: u64,
    /// Number of pages.
    pub nr_pages: u64,
    /// `PE_*` flags.
    pub flags: u32,
}

/// A process's page map: which pages file holds its bytes, and its runs in address order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pagemap {
    /// The `N` of `pages-N.img`.
    pub pages_id: u32,
    /// Runs of pages, by address.
    pub entries: Vec<PagemapEntry>,
}

type Parse<T> = std::result::Result<T, String>;

/// Every process recorded in a `pstree.img`.
pub fn parse_pstree(bytes: &[u8]) -> Parse<Vec<PstreeEntry>> {
    let mut out = Vec::new();
    for record in records(bytes, PSTREE_MAGIC, "pstree")? {
        let mut entry = PstreeEntry { pid: 0, threads: Vec::new() };
        for field in fields(record) {
            match field? {
                (1, Value::Int(v)) => entry.pid = small(v, "pid")?,
                (5, Value::Int(v)) => entry.threads.push(small(v, "tid")?),
                (5, Value::Bytes(mut packed)) => {
                    while !packed.is_empty() {
                        entry.threads.push(small(varint(&mut packed)?, "tid")?);
                    }
                }
                _ => {}
            }
        }
        if entry.pid == 0 {
            return Err("a process without a pid".to_string());
        }
        out.push(entry);
    }
    if out.is_empty() {
        return Err("no processes recorded".to_string());
    }
    Ok(out)
}

/// The memory areas of an `mm-<pid>.img` (field 14 of `mm_entry`), checked to be sorted,
/// page-aligned and disjoint.
pub fn parse_mm(bytes: &[u8]) -> Parse<Vec<Vma>> {
    let records = records(bytes, MM_MAGIC, "mm")?;
    let [record] = records[..] else {
        return Err(format!("{} records, expected one", records.len()));
    };
    let mut vmas = Vec::new();
    for field in fields(record) {
        if let (14, Value::Bytes(msg)) = field? {
            let mut vma = Vma { start: 0, end: 0, flags: 0 };
            for f in fields(msg) {
                match f? {
                    (1, Value::Int(v)) => vma.start = v,
                    (2, Value::Int(v)) => vma.end = v,
                    (6, Value::Int(v)) => vma.flags = small(v, "vma flags")?,
                    _ => {}
                }
            }
            vmas.push(vma);
        }
    }
    let mut prev_end = 0;
    for v in &vmas {
        if v.start >= v.end || v.start % PAGE_SIZE != 0 || v.end % PAGE_SIZE != 0 || v.start < prev_end {
            return Err(format!("memory area {:#x}-{:#x} is empty, unaligned or out of order", v.start, v.end));
        }
        prev_end = v.end;
    }
    Ok(vmas)
}

/// A `pagemap-<pid>.img`: its head (`pages_id`) and entries. Handles both encodings of the page
/// count (u32 field 2 before CRIU 4.2, u64 field 5 since), and old entries without flags
/// (present, or in the parent when `in_parent` is set). Entries are checked to be page-aligned,
/// in order and not overlapping.
pub fn parse_pagemap(bytes: &[u8]) -> Parse<Pagemap> {
    let records = records(bytes, PAGEMAP_MAGIC, "pagemap")?;
    let (head, rest) = records.split_first().ok_or("no pagemap head")?;
    let mut pages_id = None;
    for field in fields(head) {
        if let (1, Value::Int(v)) = field? {
            pages_id = Some(small(v, "pages_id")?);
        }
    }
    let pages_id = pages_id.ok_or("the pagemap head has no pages_id")?;
    let mut entries = Vec::with_capacity(rest.len());
    let mut prev_end = 0u64;
    for record in rest {
        let (mut vaddr, mut compat, mut wide, mut flags, mut in_parent) = (None, 0u64, None, None, false);
        for field in fields(record) {
            match field? {
                (1, Value::Int(v)) => vaddr = Some(v),
                (2, Value::Int(v)) => compat = v,
                (3, Value::Int(v)) => in_parent = v != 0,
                (4, Value::Int(v)) => flags = Some(small(v, "flags")?),
                (5, Value::Int(v)) => wide = Some(v),
                _ => {}
            }
        }
        let vaddr = vaddr.ok_or("a pagemap entry without vaddr")?;
        let nr_pages = wide.unwrap_or(compat);
        let flags = flags.unwrap_or(if in_parent { PE_PARENT } else { PE_PRESENT });
        let end = nr_pages.checked_mul(PAGE_SIZE).and_then(|len| vaddr.checked_add(len));
        match end {
            Some(end) if vaddr % PAGE_SIZE == 0 && nr_pages > 0 && vaddr >= prev_end => prev_end = end,
            _ => {
                return Err(format!(
                    "pagemap entry at {vaddr:#x} ({nr_pages} pages) is empty, unaligned or out of order"
                ))
            }
        }
        entries.push(PagemapEntry { vaddr, nr_pages, flags });
    }
    Ok(Pagemap { pages_id, entries })
}

/// The records of an image with type magic `magic`.
fn records<'a>(bytes: &'a [u8], magic: u32, kind: &str) -> Parse<Vec<&'a [u8]>> {
    let mut rest = bytes;
    if word(take(&mut rest, 4)?) != IMG_COMMON_MAGIC || word(take(&mut rest, 4)?) != magic {
        return Err(format!("not a {kind} image (bad magic)"));
    }
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = word(take(&mut rest, 4)?) as usize;
        out.push(take(&mut rest, len)?);
    }
    Ok(out)
}

/// A decoded protobuf field value.
enum Value<'a> {
    /// Varint or fixed-width scalar.
    Int(u64),
    /// Length-delimited bytes (a sub-message, string or packed list).
    Bytes(&'a [u8]),
}

/// The (field number, value) pairs of one message, in wire order.
fn fields(mut msg: &[u8]) -> impl Iterator<Item = Parse<(u64, Value<'_>)>> {
    std::iter::from_fn(move || {
        if msg.is_empty() {
            return None;
        }
        let mut next = || -> Parse<(u64, Value<'_>)> {
            let key = varint(&mut msg)?;
            let value = match key & 7 {
                0 => Value::Int(varint(&mut msg)?),
                1 => Value::Int(u64::from_le_bytes(take(&mut msg, 8)?.try_into().expect("8 bytes"))),
                5 => Value::Int(u64::from(word(take(&mut msg, 4)?))),
                2 => {
                    let len = usize::try_from(varint(&mut msg)?).map_err(|_| "bad length".to_string())?;
                    Value::Bytes(take(&mut msg, len)?)
                }
                other => return Err(format!("unexpected protobuf wire type {other}")),
            };
            Ok((key >> 3, value))
        };
        let r = next();
        if r.is_err() {
            msg = &[];
        }
        Some(r)
    })
}

fn small(v: u64, what: &str) -> Parse<u32> {
    u32::try_from(v).map_err(|_| format!("{what} {v} out of range"))
}

/// Splits the first `n` bytes off `rest`.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> Parse<&'a [u8]> {
    if rest.len() < n {
        return Err("truncated".to_string());
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

/// A little-endian u32 from the first 4 bytes of `b` (callers pass exactly 4).
fn word(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn varint(bytes: &mut &[u8]) -> Parse<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or("truncated varint")?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint too long".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn int_field(out: &mut Vec<u8>, field: u64, v: u64) {
        put_varint(out, field << 3);
        put_varint(out, v);
    }

    fn msg_field(out: &mut Vec<u8>, field: u64, msg: &[u8]) {
        put_varint(out, (field << 3) | 2);
        put_varint(out, msg.len() as u64);
        out.extend_from_slice(msg);
    }

    fn image(magic: u32, records: &[Vec<u8>]) -> Vec<u8> {
        let mut img = Vec::new();
        img.extend(IMG_COMMON_MAGIC.to_le_bytes());
        img.extend(magic.to_le_bytes());
        for r in records {
            img.extend((r.len() as u32).to_le_bytes());
            img.extend(r);
        }
        img
    }

    #[test]
    fn pstree_as_criu_4_1_wrote_it() {
        // 19843 (threads: itself) and its child 19883 with threads packed (wire type 2).
        let first = vec![
            0x08, 0x83, 0x9b, 0x01, 0x10, 0x00, 0x18, 0x83, 0x9b, 0x01, 0x20, 0x83, 0x9b, 0x01, 0x28, 0x83, 0x9b, 0x01,
        ];
        let second =
            vec![0x08, 0xab, 0x9b, 0x01, 0x10, 0x83, 0x9b, 0x01, 0x2a, 0x06, 0xab, 0x9b, 0x01, 0xac, 0x9b, 0x01];
        let img = image(PSTREE_MAGIC, &[first, second]);
        let tree = parse_pstree(&img).expect("parse");
        assert_eq!(tree[0], PstreeEntry { pid: 19843, threads: vec![19843] });
        assert_eq!(tree[1], PstreeEntry { pid: 19883, threads: vec![19883, 19884] });
        assert!(parse_pstree(&img[..img.len() - 3]).is_err(), "truncated image");
        assert!(parse_pstree(&img[4..]).is_err(), "bad magic");
        assert!(parse_pstree(&image(PSTREE_MAGIC, &[])).is_err(), "no processes");
    }

    #[test]
    fn mm_areas_are_read_and_checked() {
        let vma = |start: u64, end: u64, flags: u64| {
            let mut m = Vec::new();
            int_field(&mut m, 1, start);
            int_field(&mut m, 2, end);
            int_field(&mut m, 3, 0);
            int_field(&mut m, 6, flags);
            m
        };
        let mut mm = Vec::new();
        int_field(&mut mm, 1, 0x400000);
        msg_field(&mut mm, 14, &vma(0x1000, 0x3000, 0x22));
        int_field(&mut mm, 13, 7);
        msg_field(&mut mm, 14, &vma(0x5000, 0x6000, 0x02));
        let vmas = parse_mm(&image(MM_MAGIC, &[mm.clone()])).expect("parse");
        assert_eq!(
            vmas,
            vec![Vma { start: 0x1000, end: 0x3000, flags: 0x22 }, Vma { start: 0x5000, end: 0x6000, flags: 0x02 }]
        );
        let mut bad = mm.clone();
        msg_field(&mut bad, 14, &vma(0x2000, 0x4000, 0x22));
        assert!(parse_mm(&image(MM_MAGIC, &[bad])).unwrap_err().contains("out of order"));
        assert!(parse_mm(&image(MM_MAGIC, &[mm.clone(), mm])).unwrap_err().contains("2 records"));
    }

    #[test]
    fn pagemap_in_both_page_count_encodings() {
        let mut head = Vec::new();
        int_field(&mut head, 1, 3);
        let old = |vaddr: u64, n: u64, flags: u64| {
            let mut e = Vec::new();
            int_field(&mut e, 1, vaddr);
            int_field(&mut e, 2, n);
            int_field(&mut e, 4, flags);
            e
        };
        let mut new = Vec::new();
        int_field(&mut new, 1, 0x10000);
        int_field(&mut new, 2, 0);
        int_field(&mut new, 4, 6);
        int_field(&mut new, 5, 1 << 33);
        let mut flagless = Vec::new();
        int_field(&mut flagless, 1, 0x1000);
        int_field(&mut flagless, 2, 1);
        let pm =
            parse_pagemap(&image(PAGEMAP_MAGIC, &[head.clone(), flagless, old(0x2000, 2, 4), new])).expect("parse");
        assert_eq!(pm.pages_id, 3);
        assert_eq!(
            pm.entries,
            vec![
                PagemapEntry { vaddr: 0x1000, nr_pages: 1, flags: PE_PRESENT },
                PagemapEntry { vaddr: 0x2000, nr_pages: 2, flags: PE_PRESENT },
                PagemapEntry { vaddr: 0x10000, nr_pages: 1 << 33, flags: PE_LAZY | PE_PRESENT },
            ]
        );
        let overlapping = image(PAGEMAP_MAGIC, &[head.clone(), old(0x2000, 2, 4), old(0x3000, 1, 4)]);
        assert!(parse_pagemap(&overlapping).unwrap_err().contains("out of order"));
        let unaligned = image(PAGEMAP_MAGIC, &[head.clone(), old(0x2001, 1, 4)]);
        assert!(parse_pagemap(&unaligned).is_err());
        let overflow = image(PAGEMAP_MAGIC, &[head, old(u64::MAX - 0xfff, 2, 4)]);
        assert!(parse_pagemap(&overflow).is_err());
        assert!(parse_pagemap(&image(PAGEMAP_MAGIC, &[])).unwrap_err().contains("no pagemap head"));
    }
}
