//! Byte corpora: any file split by byte fractions, enwik8's standard split, and a folder
//! of text files (a book corpus, PG-19 style).

use std::path::{Path, PathBuf};

use crate::task::spec::{Metric, Task};
use lethe_core::config::{Config, DataConfig, FileFormat, FolderMode, Source};
use lethe_core::error::{LetheError, Result};

use super::seq::{Split, SplitData, TokenSeq};
use super::stream::TrainStreams;

/// Size of enwik8: the first 10^8 bytes of the English Wikipedia dump of 2006.
pub const ENWIK8_BYTES: usize = 100_000_000;
/// enwik8's standard split: train, valid and test sizes in bytes.
pub const ENWIK8_SPLIT: [usize; 3] = [90_000_000, 5_000_000, 5_000_000];

/// Loads one split of the file or folder named by `cfg`.
pub fn load(cfg: &DataConfig, split: Split) -> Result<SplitData> {
    let path = cfg.path.clone().ok_or_else(|| LetheError::config("data.path", "none", "a file or folder is needed"))?;
    match cfg.source {
        Source::Folder => load_folder(&path, cfg, split),
        _ => load_file(&path, cfg, split),
    }
}

/// The byte ranges `[start, end)` of train, valid and test for a file of `len` bytes.
pub fn file_ranges(path: &Path, len: usize, format: FileFormat, split: [f64; 3]) -> Result<[(usize, usize); 3]> {
    if is_enwik8(path, len, format)? {
        let [a, b, _] = ENWIK8_SPLIT;
        return Ok([(0, a), (a, a + b), (a + b, len)]);
    }
    let a = (split[0] * len as f64).round() as usize;
    let b = ((split[0] + split[1]) * len as f64).round() as usize;
    Ok([(0, a), (a, b.min(len)), (b.min(len), len)])
}

fn is_enwik8(path: &Path, len: usize, format: FileFormat) -> Result<bool> {
    let named = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("enwik8"));
    match format {
        FileFormat::Bytes => Ok(false),
        FileFormat::Auto => Ok(named && len == ENWIK8_BYTES),
        FileFormat::Enwik8 if len == ENWIK8_BYTES => Ok(true),
        FileFormat::Enwik8 => Err(LetheError::data(
            path,
            format!("data.format = enwik8 needs the standard file of {ENWIK8_BYTES} bytes; this one has {len}"),
        )),
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    let bytes = lethe_core::input::read(path).map_err(|e| {
        let named_enwik8 = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("enwik8"));
        let hint = if named_enwik8 && !path.exists() {
            "; get it with `mkdir -p data && curl -L http://mattmahoney.net/dc/enwik8.zip -o data/enwik8.zip && unzip data/enwik8.zip -d data`, or pass --data FILE"
        } else {
            ""
        };
        LetheError::data(path, format!("{e}{hint}"))
    })?;
    if bytes.is_empty() {
        return Err(LetheError::data(path, "the file is empty"));
    }
    Ok(bytes)
}

fn load_file(path: &Path, cfg: &DataConfig, split: Split) -> Result<SplitData> {
    if path.is_dir() {
        return Err(LetheError::data(path, "is a folder; use data.source = folder (--data-source folder)"));
    }
    let bytes = read_file(path)?;
    let ranges = file_ranges(path, bytes.len(), cfg.format, cfg.split)?;
    let (start, end) = ranges[split_index(split)];
    if end <= start {
        return Err(LetheError::data(
            path,
            format!("the {split} split is empty ({} bytes, data.split = {:?})", bytes.len(), cfg.split),
        ));
    }
    Ok(SplitData {
        origin: path.to_path_buf(),
        docs: vec![TokenSeq::bytes(&bytes[start..end], None, None)],
        mode: FolderMode::Concat,
        words: None,
    })
}

fn split_index(split: Split) -> usize {
    match split {
        Split::Train => 0,
        Split::Valid => 1,
        Split::Test => 2,
    }
}

/// The text files under `dir`, recursively, sorted by path; hidden entries are skipped.
/// A folder reached again through a link is walked once ([`lethe_core::input::walk`]).
fn list_files(dir: &Path) -> Result<Vec<PathBuf>> {
    lethe_core::input::walk(dir).map_err(|(d, why)| LetheError::data(d, why))
}

/// A folder's documents for `split`. When it has `train/`, `valid/` (or `validation/`)
/// and `test/` sub-folders those are the splits (PG-19's layout); otherwise its files
/// are divided by count according to `data.split`, in path order.
fn load_folder(dir: &Path, cfg: &DataConfig, split: Split) -> Result<SplitData> {
    if !dir.is_dir() {
        return Err(LetheError::data(dir, "is not a folder (data.source = folder)"));
    }
    let sub = match split {
        Split::Train => vec!["train"],
        Split::Valid => vec!["valid", "validation"],
        Split::Test => vec!["test"],
    };
    let mut files = match sub.iter().map(|s| dir.join(s)).find(|p| p.is_dir()) {
        Some(subdir) => list_files(&subdir)?,
        None => {
            let all = list_files(dir)?;
            let n = all.len() as f64;
            let a = (cfg.split[0] * n).round() as usize;
            let b = (((cfg.split[0] + cfg.split[1]) * n).round() as usize).min(all.len());
            let range = [(0, a), (a, b), (b, all.len())][split_index(split)];
            all[range.0..range.1].to_vec()
        }
    };
    if split == Split::Train && cfg.max_documents > 0 {
        files.truncate(cfg.max_documents);
    }
    let mut docs = Vec::with_capacity(files.len());
    for f in &files {
        let bytes = lethe_core::input::read(f).map_err(|e| LetheError::data(f, e))?;
        if !bytes.is_empty() {
            docs.push(TokenSeq::bytes(&bytes, None, None));
        }
    }
    if docs.is_empty() {
        return Err(LetheError::data(
            dir,
            format!("no non-empty documents for the {split} split ({} files found there)", files.len()),
        ));
    }
    Ok(SplitData { origin: dir.to_path_buf(), docs, mode: cfg.folder_mode, words: None })
}

/// Byte corpora in the registry ([`crate::task::of`]): one file, or a folder of text files.
pub enum Corpus {
    /// `data.source = "file"`.
    File,
    /// `data.source = "folder"`.
    Folder,
}

impl Task for Corpus {
    fn name(&self) -> &'static str {
        match self {
            Corpus::File => "file",
            Corpus::Folder => "folder",
        }
    }

    fn describe(&self, d: &DataConfig) -> String {
        let path = d.path.as_deref().unwrap_or(Path::new("?"));
        match self {
            Corpus::Folder => format!("folder {} ({:?} mode)", path.display(), d.folder_mode).to_lowercase(),
            Corpus::File => describe_file(path, d),
        }
    }

    fn metric(&self) -> Metric {
        Metric::Bpb
    }

    /// The split's bytes, tokenised when the config names a tokenizer.
    fn load_split(&self, cfg: &Config, split: Split, _batch: usize) -> Result<SplitData> {
        super::text::prepare(cfg, load(&cfg.data, split)?, false)
    }

    /// `batch` streams over the training split, in an order drawn from the data seed.
    fn train_streams(&self, cfg: &Config, batch: usize) -> Result<TrainStreams> {
        let split = self.load_split(cfg, Split::Train, batch)?;
        TrainStreams::of_split(&split, batch, cfg.train.block, cfg.data_seed())
    }
}

/// The file's size and split, or why it cannot be read.
fn describe_file(path: &Path, d: &DataConfig) -> String {
    let len = std::fs::metadata(path).map(|m| m.len() as usize).unwrap_or(0);
    match file_ranges(path, len, d.format, d.split) {
        Ok(r) if len == ENWIK8_BYTES && r[0].1 == ENWIK8_SPLIT[0] && d.format != FileFormat::Bytes => {
            format!("{} as enwik8: standard split, train 90M / valid 5M / test 5M bytes", path.display())
        }
        Ok(r) => format!(
            "{}: {len} bytes split by fractions {:?}: train {} / valid {} / test {} bytes",
            path.display(),
            d.split,
            r[0].1 - r[0].0,
            r[1].1 - r[1].0,
            r[2].1 - r[2].0
        ),
        Err(e) => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bytes_of, Token};

    #[test]
    fn enwik8_split_is_90_5_5_million() {
        let r = file_ranges(Path::new("/x/enwik8"), ENWIK8_BYTES, FileFormat::Auto, [0.5, 0.25, 0.25]).unwrap();
        assert_eq!(r, [(0, 90_000_000), (90_000_000, 95_000_000), (95_000_000, 100_000_000)]);
    }

    #[test]
    fn other_files_split_by_fractions() {
        let r = file_ranges(Path::new("/x/enwik8"), 1000, FileFormat::Auto, [0.8, 0.1, 0.1]).unwrap();
        assert_eq!(r, [(0, 800), (800, 900), (900, 1000)]);
        let r = file_ranges(Path::new("/x/book.txt"), ENWIK8_BYTES, FileFormat::Auto, [0.8, 0.1, 0.1]).unwrap();
        assert_eq!(r[0], (0, 80_000_000));
    }

    fn folder_config(path: &Path, mode: FolderMode) -> DataConfig {
        DataConfig {
            source: Source::Folder,
            path: Some(path.to_path_buf()),
            folder_mode: mode,
            ..DataConfig::default()
        }
    }

    #[test]
    fn a_folder_is_split_by_document_count_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..10 {
            std::fs::write(dir.path().join(format!("book{i:02}.txt")), vec![b'a' + i as u8; 5 + i]).unwrap();
        }
        std::fs::write(dir.path().join(".hidden"), b"skip me").unwrap();
        let mut cfg = folder_config(dir.path(), FolderMode::Documents);
        cfg.split = [0.8, 0.1, 0.1];
        let train = load(&cfg, Split::Train).unwrap();
        assert_eq!(train.docs.len(), 8);
        assert_eq!(bytes_of(&train.docs[0].tokens), vec![b'a'; 5]);
        let test = load(&cfg, Split::Test).unwrap();
        assert_eq!(test.docs.len(), 1);
        assert_eq!(bytes_of(&test.docs[0].tokens), vec![b'j'; 14]);
        // Documents mode keeps each book whole within a stream.
        let streams = train.into_streams(2);
        for s in &streams {
            let mut runs = s.tokens.chunk_by(|a, b| a == b).map(|r| (r[0], r.len()));
            assert!(runs.all(|(byte, len)| len == 5 + (byte - Token::from(b'a')) as usize));
        }
    }

    #[test]
    fn a_pg19_layout_uses_its_split_folders() {
        let dir = tempfile::tempdir().unwrap();
        for (sub, n) in [("train", 3), ("validation", 2), ("test", 1)] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
            for i in 0..n {
                std::fs::write(dir.path().join(sub).join(format!("{i}.txt")), format!("{sub} {i}")).unwrap();
            }
        }
        let cfg = folder_config(dir.path(), FolderMode::Concat);
        assert_eq!(load(&cfg, Split::Train).unwrap().docs.len(), 3);
        let valid = load(&cfg, Split::Valid).unwrap();
        assert_eq!(valid.docs.len(), 2);
        assert_eq!(bytes_of(&valid.docs[1].tokens), b"validation 1".to_vec());
        assert_eq!(load(&cfg, Split::Test).unwrap().docs.len(), 1);
        // The paper's subset: the first books of the training split only.
        let mut first = folder_config(dir.path(), FolderMode::Concat);
        first.max_documents = 2;
        let train = load(&first, Split::Train).unwrap();
        assert_eq!(
            train.docs.iter().map(|d| bytes_of(&d.tokens)).collect::<Vec<_>>(),
            vec![b"train 0".to_vec(), b"train 1".to_vec()]
        );
        assert_eq!(load(&first, Split::Valid).unwrap().docs.len(), 2);
    }

    #[test]
    fn forced_enwik8_format_rejects_a_wrong_size() {
        let err = file_ranges(Path::new("/x/data.txt"), 1234, FileFormat::Enwik8, [0.9, 0.05, 0.05]).unwrap_err();
        assert!(err.to_string().contains("1234"), "{err}");
    }
}
