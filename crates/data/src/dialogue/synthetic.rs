//! A small generated data set in the CMU-DoG layout, for tests and the CPU comparison
//! (`lethe dialogue-data --out DIR`).
//!
//! Each conversation has a movie of its own, with facts drawn at random: title, year,
//! genre, director, three actors in three roles, a rating, the critics' word and three
//! plot sections. Speaker A asks about the movie and speaker B, who has read the
//! document, answers from it:
//!
//! ```text
//! A: who directed it ?
//! B: it was directed by nora vance .
//! ```
//!
//! Because no movie repeats, an answer cannot be learned into the weights: a model
//! without the document can only guess a name from the pools (1 in 30 for a surname),
//! and a model with the document beyond its window must carry it in memory. The
//! document is about 300 words, longer than the CPU presets' windows.
//!
//! Everything is lower case with punctuation as separate words, and the folder gets a
//! word vocabulary of its own (`tokenizer/tokenizer.json`, every word of every split),
//! so that a small word-level model reads it.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::{Conversation, Turn};
use crate::tokenizer::Tokenizer;
use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;

const FIRST: [&str; 30] = [
    "nora", "ivan", "lena", "omar", "tess", "hugo", "mila", "ravi", "zoe", "felix", "ada", "jonas", "iris", "caleb",
    "maya", "otto", "rosa", "emil", "vera", "leon", "ines", "theo", "kira", "dario", "nina", "abel", "lucia", "milo",
    "greta", "sami",
];
const LAST: [&str; 30] = [
    "vance",
    "okafor",
    "lindqvist",
    "moreau",
    "tanaka",
    "kowalski",
    "reyes",
    "brandt",
    "castillo",
    "novak",
    "oduya",
    "petrov",
    "haddad",
    "silva",
    "morgan",
    "fischer",
    "adeyemi",
    "larsen",
    "costa",
    "byrne",
    "ivanova",
    "hale",
    "duarte",
    "keller",
    "nakamura",
    "quinn",
    "romero",
    "sato",
    "weber",
    "ellis",
];
const ROLES: [&str; 24] = [
    "the captain",
    "the detective",
    "the baker",
    "the pilot",
    "the teacher",
    "the thief",
    "the doctor",
    "the singer",
    "the mayor",
    "the farmer",
    "the spy",
    "the robot",
    "the painter",
    "the knight",
    "the chef",
    "the boxer",
    "the witch",
    "the sailor",
    "the judge",
    "the dancer",
    "the hunter",
    "the nurse",
    "the writer",
    "the ghost",
];
const ADJECTIVES: [&str; 16] = [
    "silent", "broken", "golden", "last", "hidden", "burning", "frozen", "distant", "secret", "lonely", "wild",
    "quiet", "endless", "crimson", "lost", "electric",
];
const NOUNS: [&str; 16] = [
    "harbor", "garden", "signal", "mountain", "letter", "river", "machine", "island", "promise", "window", "kingdom",
    "road", "winter", "circus", "mirror", "station",
];
const GENRES: [&str; 8] = ["comedy", "drama", "thriller", "western", "musical", "horror", "romance", "mystery"];
const PRAISE: [&str; 10] =
    ["brilliant", "charming", "dull", "moving", "clumsy", "gripping", "silly", "beautiful", "slow", "bold"];
const PLACES: [&str; 12] = [
    "the city",
    "the harbor",
    "a small town",
    "the desert",
    "the old house",
    "the school",
    "the border",
    "the palace",
    "the forest",
    "the station",
    "the island",
    "the hospital",
];
const EVENTS: [&str; 12] = [
    "arrives in",
    "runs away from",
    "finds a map in",
    "loses a letter in",
    "meets a stranger in",
    "hides in",
    "returns to",
    "sets a trap in",
    "gives a speech in",
    "falls ill in",
    "opens a shop in",
    "searches for help in",
];

/// A movie's facts, drawn at random.
struct Movie {
    title: String,
    year: usize,
    genre: &'static str,
    director: String,
    cast: Vec<(String, &'static str)>,
    score: usize,
    praise: &'static str,
    plot: Vec<String>,
}

/// CMU-DoG's user ids of speakers 0 and 1.
const USERS: [&str; 2] = ["user1", "user2"];

/// A uniform index below `n` (> 0).
fn below(rng: &mut Rng, n: usize) -> usize {
    rng.range(0, n - 1)
}

fn pick<T: Copy>(rng: &mut Rng, items: &[T]) -> T {
    items[below(rng, items.len())]
}

fn name(rng: &mut Rng) -> String {
    format!("{} {}", pick(rng, &FIRST), pick(rng, &LAST))
}

impl Movie {
    fn draw(rng: &mut Rng) -> Movie {
        let title = format!("the {} {}", pick(rng, &ADJECTIVES), pick(rng, &NOUNS));
        let mut roles: Vec<&'static str> = ROLES.to_vec();
        let cast = (0..3)
            .map(|_| {
                let role = roles.remove(below(rng, roles.len()));
                (name(rng), role)
            })
            .collect::<Vec<_>>();
        let plot = (0..3)
            .map(|_| {
                (0..6)
                    .map(|_| {
                        let (_, role) = cast[below(rng, cast.len())];
                        format!("{role} {} {} .", pick(rng, &EVENTS), pick(rng, &PLACES))
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        Movie {
            year: rng.range(1950, 2020),
            genre: pick(rng, &GENRES),
            director: name(rng),
            score: rng.range(20, 100),
            praise: pick(rng, &PRAISE),
            title,
            cast,
            plot,
        }
    }

    /// The movie as a CMU-DoG WikiData file with document number `index`.
    fn wikidata(&self, index: usize) -> serde_json::Value {
        let cast: Vec<String> = self.cast.iter().map(|(actor, role)| format!("{actor} as {role}")).collect();
        json!({
            "0": {
                "movieName": self.title,
                "year": self.year.to_string(),
                "director": self.director,
                "genre": self.genre,
                "cast": cast,
                "introduction": format!("{} is a {} {} film directed by {} .", self.title, self.year, self.genre, self.director),
                "rating": [format!("rotten tomatoes : {} %", self.score)],
                "critical_response": [format!("critics called it {} .", self.praise)],
            },
            "1": self.plot[0], "2": self.plot[1], "3": self.plot[2],
            "index": index,
        })
    }

    /// Questions about the movie and the answers from its document.
    fn questions(&self) -> Vec<(String, String)> {
        let mut qa = vec![
            (format!("have you seen {} ?", self.title), format!("yes , it is a {} from {} .", self.genre, self.year)),
            ("who directed it ?".to_string(), format!("it was directed by {} .", self.director)),
            ("what did the critics say ?".to_string(), format!("critics called it {} .", self.praise)),
            ("how was it rated ?".to_string(), format!("rotten tomatoes gave it {} % .", self.score)),
        ];
        for (actor, role) in &self.cast {
            qa.push((format!("who plays {role} ?"), format!("{actor} plays {role} .")));
        }
        qa
    }
}

/// A conversation about `movie`: greetings, 3 to 5 questions in random order with a
/// word of chat between some, and a goodbye. Speaker 0 asks, speaker 1 answers.
fn conversation(movie: &Movie, rng: &mut Rng) -> Vec<Turn> {
    let mut lines = vec![("hi !".to_string(), "hello , what movie did you get ?".to_string())];
    let mut qa = movie.questions();
    for _ in 0..rng.range(3, 5) {
        let (q, a) = qa.remove(below(rng, qa.len()));
        lines.push((q, a));
        if rng.uniform() < 0.3 {
            lines.push((
                format!("i like {} films .", movie.genre),
                pick(rng, &["me too .", "not me .", "they are ok ."]).to_string(),
            ));
        }
    }
    lines.push(("thanks , bye !".to_string(), "bye !".to_string()));
    lines.into_iter().flat_map(|(q, a)| [Turn { speaker: 0, text: q }, Turn { speaker: 1, text: a }]).collect()
}

/// Most conversations `write` makes.
pub const MAX_CONVERSATIONS: usize = 1_000_000;

/// What was written.
#[derive(Debug)]
pub struct Written {
    /// Conversations per split: train, valid, test.
    pub counts: [usize; 3],
    /// The word vocabulary's folder (`DIR/tokenizer`).
    pub tokenizer: PathBuf,
    /// Words in the vocabulary.
    pub words: usize,
}

/// Conversations per split for `n` in all: 0.05 and 0.15 of them (at least one each)
/// for valid and test, the rest for train.
pub fn split_counts(n: usize) -> [usize; 3] {
    let valid = ((n as f64 * 0.05).round() as usize).max(1);
    let test = ((n as f64 * 0.15).round() as usize).max(1);
    [n - valid - test, valid, test]
}

/// Where [`write`] builds the data set before moving its three folders into place.
const STAGING: &str = ".dialogue-data.partial";

/// Writes `n` generated conversations under `dir` in the CMU-DoG layout, with a word
/// vocabulary. `dir` must not hold a data set already; nothing is written when it does.
/// The files are written into a staging folder first (`dir/.dialogue-data.partial`), and
/// its three folders renamed into place when all are written, so an interrupted or failed
/// run leaves no half data set that would read as a whole one.
pub fn write(dir: &Path, n: usize, seed: u64) -> Result<Written> {
    if n < 20 {
        return Err(LetheError::config("--conversations", n, "must be at least 20 (the test split is 15% of them)"));
    }
    // About 8 KB of files each: a million is 8 GB, far past any CPU demonstration.
    if n > MAX_CONVERSATIONS {
        return Err(LetheError::config(
            "--conversations",
            n,
            format!("must be at most {MAX_CONVERSATIONS} (about 8 KB of files each)"),
        ));
    }
    if dir.exists() && !dir.is_dir() {
        return Err(LetheError::data(dir, "is a file: --out names the folder to write the data set into"));
    }
    for sub in ["WikiData", "Conversations", "tokenizer"] {
        if dir.join(sub).exists() {
            return Err(LetheError::data(dir.join(sub), "exists already; choose an empty folder"));
        }
    }
    let staging = dir.join(STAGING);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| LetheError::io(&staging, e))?;
    }
    let made = lethe_core::output::MadeFolder::make(dir)?;
    let written = write_into(&staging, n, seed);
    let moved = written.and_then(|w| {
        // Conversations/, which marks a data set (`Source::for_path`), goes last.
        for sub in ["tokenizer", "WikiData", "Conversations"] {
            std::fs::rename(staging.join(sub), dir.join(sub)).map_err(|e| LetheError::io(dir.join(sub), e))?;
        }
        Ok(Written { tokenizer: dir.join("tokenizer"), ..w })
    });
    let _ = std::fs::remove_dir_all(&staging);
    made.unless_failed(moved)
}

/// Writes the data set's three folders into `dir`.
fn write_into(dir: &Path, n: usize, seed: u64) -> Result<Written> {
    let counts = split_counts(n);
    let mut rng = Rng::new(seed);
    let mut text = String::new();
    let io = |p: &Path, e| LetheError::io(p, e);
    let wikidata = dir.join("WikiData");
    std::fs::create_dir_all(&wikidata).map_err(|e| io(&wikidata, e))?;
    for (split, name) in ["train", "valid", "test"].iter().enumerate() {
        let folder = dir.join("Conversations").join(name);
        std::fs::create_dir_all(&folder).map_err(|e| io(&folder, e))?;
        let first: usize = counts[..split].iter().sum();
        for index in first..first + counts[split] {
            let movie = Movie::draw(&mut rng);
            let turns = conversation(&movie, &mut rng);
            let wiki = movie.wikidata(index);
            let history: Vec<serde_json::Value> =
                turns.iter().map(|t| json!({"docIdx": 0, "text": t.text, "uid": USERS[t.speaker]})).collect();
            let convo = json!({"docLinkIdx": index, "history": history, "whoSawDoc": ["user2"]});
            write_json(&wikidata.join(format!("movie_{index:05}.json")), &wiki)?;
            write_json(&folder.join(format!("{index:05}.json")), &convo)?;
            let c = Conversation { document: super::document_text(&wiki), turns };
            c.segments(true).iter().for_each(|(s, _)| text.push_str(s));
        }
    }
    let vocab = Tokenizer::train_words(&[&text], 1, 0)?;
    let tokenizer = dir.join("tokenizer");
    std::fs::create_dir_all(&tokenizer).map_err(|e| io(&tokenizer, e))?;
    lethe_core::checkpoint::write_atomic(&tokenizer.join("tokenizer.json"), vocab.to_json()?.as_bytes())?;
    Ok(Written { counts, tokenizer, words: vocab.vocab_size() })
}

/// Writes `value` as pretty JSON to `path`, whose folder exists.
fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value)?;
    std::fs::write(path, bytes).map_err(|e| LetheError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Split;

    #[test]
    fn splits_are_a_twentieth_and_three_twentieths() {
        assert_eq!(split_counts(4112), [3289, 206, 617]);
        assert_eq!(split_counts(20), [16, 1, 3]);
    }

    #[test]
    fn written_data_read_back_with_every_answer_in_its_document() {
        let dir = tempfile::tempdir().unwrap();
        let w = write(dir.path(), 40, 7).unwrap();
        assert_eq!(w.counts, [32, 2, 6]);
        assert!(w.tokenizer.join("tokenizer.json").is_file());
        for (split, n) in [(Split::Train, 32), (Split::Valid, 2), (Split::Test, 6)] {
            let convs = super::super::read_split(dir.path(), split).unwrap();
            assert_eq!(convs.len(), n);
            for c in &convs {
                // "it was directed by X Y ." : X Y is in the document.
                let answer = c.turns.iter().find_map(|t| t.text.strip_prefix("it was directed by "));
                if let Some(a) = answer {
                    assert!(c.document.contains(a.trim_end_matches(" .")), "{a} not in {}", c.document);
                }
                assert_eq!(
                    c.turns.iter().map(|t| t.speaker).collect::<Vec<_>>(),
                    (0..c.turns.len()).map(|i| i % 2).collect::<Vec<_>>()
                );
            }
        }
        // Same seed, same data; a second write into the same folder is refused.
        let again = tempfile::tempdir().unwrap();
        write(again.path(), 40, 7).unwrap();
        let a = std::fs::read(dir.path().join("Conversations/test/00039.json")).unwrap();
        assert_eq!(a, std::fs::read(again.path().join("Conversations/test/00039.json")).unwrap());
        assert!(write(dir.path(), 40, 7).unwrap_err().to_string().contains("exists already"));
    }

    #[test]
    fn a_data_set_appears_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        // What an interrupted run left behind is replaced; nothing stays staged.
        std::fs::create_dir_all(dir.path().join(STAGING).join("WikiData")).unwrap();
        std::fs::write(dir.path().join(STAGING).join("WikiData/movie_99999.json"), "{").unwrap();
        write(dir.path(), 20, 1).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["Conversations", "WikiData", "tokenizer"]);
        assert_eq!(std::fs::read_dir(dir.path().join("WikiData")).unwrap().count(), 20);
        assert!(!dir.path().join("WikiData/movie_99999.json").exists());
    }
}
