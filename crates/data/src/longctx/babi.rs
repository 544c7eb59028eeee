//! BABILong-style reasoning (Kuratov et al., 2024): the first five bAbI tasks (Weston et
//! al., 2016), their facts scattered in order through a haystack, the question after it.
//!
//! | task | bAbI | question | answer |
//! |---|---|---|---|
//! | `qa1` | single supporting fact | Where is Mary? | a place |
//! | `qa2` | two supporting facts | Where is the milk? | a place |
//! | `qa3` | three supporting facts | Where was the milk before the kitchen? | a place |
//! | `qa4` | two-argument relations | What is north of the kitchen? | a place |
//! | `qa5` | three-argument relations | Who gave the milk to Fred? | a person or object |
//!
//! The stories come from a small world simulator ([`World`]): people move between six
//! places, pick up, drop and give three objects; each action is a fact (`Mary went to
//! the kitchen.`, `John got the milk there.`, `Fred gave the apple to Jeff.`), drawn among
//! the actions valid in the world's state, and the question is asked of that state.
//! Scoring is BABILong's ([`Scoring::Only`]): the first sentence of the answer must name
//! the expected label and no other of the task's labels (those the question names
//! aside).
//!
//! Where lethe differs: bAbI's stories are read from its released files; lethe simulates
//! its own, with bAbI's vocabulary, verbs and question forms, and as many facts as
//! bAbI's stories of each task typically hold (a few to a dozen). BABILong's prompts add
//! worked examples and an answer format for chat models; lethe keeps its instruction
//! and ends the question with ` Answer:`, which the model continues. The facts are
//! spread at uniform random positions, as BABILong spreads them: these tasks have no
//! depth.

use lethe_core::rng::Rng;

use super::assemble::{Needle, Pieces};
use super::Scoring;

/// The places of bAbI's world.
pub const PLACES: [&str; 6] = ["bathroom", "bedroom", "garden", "hallway", "kitchen", "office"];

/// The objects people carry.
pub const OBJECTS: [&str; 3] = ["apple", "football", "milk"];

/// The people of `qa1`-`qa3`.
const PEOPLE: [&str; 4] = ["Mary", "John", "Daniel", "Sandra"];

/// The people of `qa5`.
const GIVERS: [&str; 4] = ["Bill", "Fred", "Jeff", "Mary"];

/// The compass directions of `qa4`, clockwise.
const DIRECTIONS: [&str; 4] = ["north", "east", "south", "west"];

const MOVES: [&str; 5] = ["moved to", "went to", "journeyed to", "travelled to", "went back to"];
const TAKES: [&str; 4] = ["picked up", "got", "grabbed", "took"];
const DROPS: [&str; 4] = ["dropped", "discarded", "put down", "left"];
const GIVES: [&str; 3] = ["gave", "handed", "passed"];

/// The five tasks' names.
pub const QA: [&str; 5] = ["qa1", "qa2", "qa3", "qa4", "qa5"];

/// One sample's pieces of bAbI task `task` (one of [`QA`]).
pub fn pieces(task: &'static str, rng: &mut Rng) -> Pieces {
    let (facts, question, answer, labels) = match task {
        "qa1" => story(rng, &PEOPLE, [1.0, 0.0, 0.0, 0.0], (2, 8), where_is_person),
        "qa2" => story(rng, &PEOPLE, [3.0, 2.0, 1.0, 0.0], (4, 12), where_is_object),
        "qa3" => story(rng, &PEOPLE, [3.0, 2.0, 1.0, 0.0], (6, 16), where_was_object),
        "qa4" => relations(rng),
        _ => story(rng, &GIVERS, [2.0, 2.0, 1.0, 3.0], (4, 12), who_gave),
    };
    let others = labels.into_iter().filter(|l| *l != answer && !question.contains(l.as_str())).collect();
    let mut depths: Vec<f64> = facts.iter().map(|_| rng.uniform()).collect();
    depths.sort_by(f64::total_cmp);
    Pieces {
        task,
        head: instruction(task).into(),
        needles: facts.into_iter().zip(depths).map(|(text, depth)| Needle { text, depth }).collect(),
        tail: format!(" Question: {question} Answer:"),
        answers: vec![answer],
        scoring: Scoring::Only(others),
    }
}

/// BABILong's instruction for `task`.
fn instruction(task: &str) -> &'static str {
    const CARRY: &str = "I give you context with the facts about locations and actions of different persons hidden in some random text and a question. You need to answer the question based only on the information from the facts. If a person got an item in the first location and travelled to the second location the item is also in the second location. If a person dropped an item in the first location and moved to the second location the item remains in the first location.";
    match task {
        "qa1" => "I will give you context with the facts about positions of different persons hidden in some random text and a question. You need to answer the question based only on the information from the facts. If a person was in different locations, use the latest location to answer the question.",
        "qa2" | "qa3" => CARRY,
        "qa4" => "I will give you context with the facts about different people, their location and actions, hidden in some random text and a question. You need to answer the question based only on the information from the facts.",
        _ => "I will give you context with the facts about locations and their relations hidden in some random text and a question. You need to answer the question based only on the information from the facts.",
    }
}

/// A story's facts, its question and answer, and the task's labels.
type Story = (Vec<String>, String, String, Vec<String>);

/// A question asked of a world: `(question, answer)`, or `None` when this world cannot
/// answer it yet.
type Ask = fn(&World, &mut Rng) -> Option<(String, String)>;

/// A story of `people` acting with these weights (move, take, drop, give), of between
/// `facts.0` and `facts.1` facts, ended at the first length from a drawn one on at which
/// `ask` has a question (drawn anew when none up to `facts.1` has).
fn story(rng: &mut Rng, people: &'static [&'static str], weights: [f32; 4], facts: (usize, usize), ask: Ask) -> Story {
    let target = rng.range(facts.0, facts.1);
    let labels: Vec<String> = if people == GIVERS.as_slice() {
        GIVERS.iter().chain(OBJECTS.iter()).map(|s| s.to_string()).collect()
    } else {
        PLACES.iter().map(|s| s.to_string()).collect()
    };
    loop {
        let mut world = World::new(people);
        while world.facts.len() < facts.1 {
            world.act(weights, rng);
            if world.facts.len() >= target {
                if let Some((question, answer)) = ask(&world, rng) {
                    return (world.facts, question, answer, labels);
                }
            }
        }
    }
}

/// `qa1`: where a person who has moved is.
fn where_is_person(world: &World, rng: &mut Rng) -> Option<(String, String)> {
    let located: Vec<usize> = (0..world.people.len()).filter(|&p| world.at[p].is_some()).collect();
    let p = *pick(&located, rng)?;
    Some((format!("Where is {}?", world.people[p]), PLACES[world.at[p]?].to_string()))
}

/// `qa2`: where an object that has been picked up is now.
fn where_is_object(world: &World, rng: &mut Rng) -> Option<(String, String)> {
    let seen: Vec<usize> = (0..OBJECTS.len()).filter(|&o| world.place_of(o).is_some()).collect();
    let o = *pick(&seen, rng)?;
    Some((format!("Where is the {}?", OBJECTS[o]), PLACES[world.place_of(o)?].to_string()))
}

/// `qa3`: where an object was before the place it is in now (a place it had not been in
/// before, so that "before" names one moment).
fn where_was_object(world: &World, rng: &mut Rng) -> Option<(String, String)> {
    let moved: Vec<usize> = (0..OBJECTS.len())
        .filter(|&o| {
            let trail = &world.trail[o];
            trail.len() >= 2 && !trail[..trail.len() - 1].contains(&trail[trail.len() - 1])
        })
        .collect();
    let o = *pick(&moved, rng)?;
    let trail = &world.trail[o];
    let (before, now) = (trail[trail.len() - 2], trail[trail.len() - 1]);
    Some((format!("Where was the {} before the {}?", OBJECTS[o], PLACES[now]), PLACES[before].to_string()))
}

/// `qa5`: a question about the last hand-over, in one of bAbI's five forms, whichever
/// the story answers one way only.
fn who_gave(world: &World, rng: &mut Rng) -> Option<(String, String)> {
    let last = *world.gives.last()?;
    let [giver, object, receiver] = last;
    let (p, o) = (|i: usize| world.people[i].to_string(), |i: usize| OBJECTS[i].to_string());
    // Each form: its question, its answer, the fields of a hand-over it names and the
    // one it asks (0 the giver, 1 the object, 2 the receiver).
    let mut forms: Vec<(String, String, Vec<usize>, usize)> = vec![
        (format!("Who gave the {}?", o(object)), p(giver), vec![1], 0),
        (format!("Who received the {}?", o(object)), p(receiver), vec![1], 2),
        (format!("Who did {} give the {} to?", p(giver), o(object)), p(receiver), vec![0, 1], 2),
        (format!("What did {} give to {}?", p(giver), p(receiver)), o(object), vec![0, 2], 1),
        (format!("Who gave the {} to {}?", o(object), p(receiver)), p(giver), vec![1, 2], 0),
    ];
    rng.shuffle(&mut forms);
    forms.into_iter().find_map(|(question, answer, named, asked)| {
        let alike = |g: &&Give| named.iter().all(|&k| g[k] == last[k]);
        let one_way = world.gives.iter().filter(alike).all(|g| g[asked] == last[asked]);
        one_way.then_some((question, answer))
    })
}

/// `qa4`: two places' positions relative to a third, and a question about one of them.
fn relations(rng: &mut Rng) -> Story {
    let mut places: Vec<usize> = (0..PLACES.len()).collect();
    rng.shuffle(&mut places);
    let (a, b, c) = (places[0], places[1], places[2]);
    let d1 = rng.range(0, 3);
    let d2 = (d1 + rng.range(1, 3)) % 4;
    let mut facts = vec![
        format!("The {} is {} of the {}.", PLACES[a], DIRECTIONS[d1], PLACES[b]),
        format!("The {} is {} of the {}.", PLACES[c], DIRECTIONS[d2], PLACES[b]),
    ];
    rng.shuffle(&mut facts);
    let opposite = |d: usize| DIRECTIONS[(d + 2) % 4];
    let (question, answer) = match rng.range(0, 3) {
        0 => (format!("What is {} of the {}?", DIRECTIONS[d1], PLACES[b]), a),
        1 => (format!("What is {} of the {}?", DIRECTIONS[d2], PLACES[b]), c),
        // b is south of a when a is north of b.
        2 => (format!("What is the {} {} of?", PLACES[b], opposite(d1)), a),
        _ => (format!("What is the {} {} of?", PLACES[b], opposite(d2)), c),
    };
    (facts, question, PLACES[answer].to_string(), PLACES.iter().map(|s| s.to_string()).collect())
}

/// A random element of `items`, `None` when there is none.
fn pick<'a, T>(items: &'a [T], rng: &mut Rng) -> Option<&'a T> {
    (!items.is_empty()).then(|| &items[rng.range(0, items.len() - 1)])
}

/// A hand-over: giver, object, receiver.
type Give = [usize; 3];

/// Where an object is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Whereabouts {
    /// Not yet mentioned.
    Unseen,
    /// Carried by a person.
    Held(usize),
    /// Lying in a place.
    At(usize),
}

/// bAbI's world: who is where and who holds what, with the facts that made it so.
#[derive(Clone, Debug)]
pub struct World {
    people: &'static [&'static str],
    /// Each person's place, once a fact has said it.
    at: Vec<Option<usize>>,
    objects: Vec<Whereabouts>,
    /// Each object's places in turn, a place repeated only after another.
    trail: Vec<Vec<usize>>,
    /// Hand-overs.
    gives: Vec<Give>,
    /// The story so far.
    facts: Vec<String>,
}

impl World {
    fn new(people: &'static [&'static str]) -> Self {
        World {
            people,
            at: vec![None; people.len()],
            objects: vec![Whereabouts::Unseen; OBJECTS.len()],
            trail: vec![vec![]; OBJECTS.len()],
            gives: vec![],
            facts: vec![],
        }
    }

    /// The place of object `o`, once known.
    fn place_of(&self, o: usize) -> Option<usize> {
        match self.objects[o] {
            Whereabouts::Unseen => None,
            Whereabouts::Held(p) => self.at[p],
            Whereabouts::At(place) => Some(place),
        }
    }

    /// One more fact: an action of kind drawn from `weights` (move, take, drop, give),
    /// among those the world allows; a move is always allowed.
    fn act(&mut self, weights: [f32; 4], rng: &mut Rng) {
        let p = rng.range(0, self.people.len() - 1);
        let done = match rng.categorical(&weights) {
            1 => self.take(p, rng),
            2 => self.drop(p, rng),
            3 => self.give(p, rng),
            _ => false,
        };
        if !done {
            self.go(p, rng);
        }
    }

    fn go(&mut self, p: usize, rng: &mut Rng) {
        let mut place = rng.range(0, PLACES.len() - 1);
        while Some(place) == self.at[p] {
            place = rng.range(0, PLACES.len() - 1);
        }
        self.at[p] = Some(place);
        for o in 0..OBJECTS.len() {
            if self.objects[o] == Whereabouts::Held(p) {
                self.arrive(o, place);
            }
        }
        let verb = MOVES[rng.range(0, MOVES.len() - 1)];
        self.facts.push(format!("{} {verb} the {}.", self.people[p], PLACES[place]));
    }

    /// Person `p` picks up an object lying where they are (or not yet seen); false when
    /// there is none or `p`'s place is unknown.
    fn take(&mut self, p: usize, rng: &mut Rng) -> bool {
        let Some(place) = self.at[p] else { return false };
        let free: Vec<usize> = (0..OBJECTS.len())
            .filter(|&o| matches!(self.objects[o], Whereabouts::Unseen) || self.objects[o] == Whereabouts::At(place))
            .collect();
        let Some(&o) = pick(&free, rng) else { return false };
        self.objects[o] = Whereabouts::Held(p);
        self.arrive(o, place);
        let verb = TAKES[rng.range(0, TAKES.len() - 1)];
        self.facts.push(format!("{} {verb} the {} there.", self.people[p], OBJECTS[o]));
        true
    }

    /// Person `p` puts down an object they carry; false when they carry none.
    fn drop(&mut self, p: usize, rng: &mut Rng) -> bool {
        let (Some(place), Some(o)) = (self.at[p], self.carried(p, rng)) else { return false };
        self.objects[o] = Whereabouts::At(place);
        let verb = DROPS[rng.range(0, DROPS.len() - 1)];
        self.facts.push(format!("{} {verb} the {}.", self.people[p], OBJECTS[o]));
        true
    }

    /// Person `p` hands an object they carry to someone in the same place.
    fn give(&mut self, p: usize, rng: &mut Rng) -> bool {
        let Some(o) = self.carried(p, rng) else { return false };
        let near: Vec<usize> = (0..self.people.len()).filter(|&q| q != p && self.at[q] == self.at[p]).collect();
        let Some(&q) = pick(&near, rng) else { return false };
        self.objects[o] = Whereabouts::Held(q);
        self.gives.push([p, o, q]);
        let verb = GIVES[rng.range(0, GIVES.len() - 1)];
        self.facts.push(format!("{} {verb} the {} to {}.", self.people[p], OBJECTS[o], self.people[q]));
        true
    }

    /// An object `p` carries, if any.
    fn carried(&self, p: usize, rng: &mut Rng) -> Option<usize> {
        let held: Vec<usize> = (0..OBJECTS.len()).filter(|&o| self.objects[o] == Whereabouts::Held(p)).collect();
        pick(&held, rng).copied()
    }

    /// Object `o` is now in `place`: its trail grows when the place is new to it.
    fn arrive(&mut self, o: usize, place: usize) {
        if self.trail[o].last() != Some(&place) {
            self.trail[o].push(place);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bAbI read by rule: replays the facts into a world of its own and answers the
    /// question from it, without the generator's state.
    fn read(facts: &[String], question: &str) -> String {
        let mut place_of_person: Vec<(String, String)> = vec![];
        let mut holder: Vec<(String, String)> = vec![]; // object -> person
        let mut lying: Vec<(String, String)> = vec![]; // object -> place
        let mut trail: Vec<(String, Vec<String>)> = vec![];
        let mut gives: Vec<(String, String, String)> = vec![];
        let mut relations: Vec<(String, String, String)> = vec![];
        let set = |v: &mut Vec<(String, String)>, k: &str, val: &str| {
            v.retain(|(a, _)| a != k);
            v.push((k.to_string(), val.to_string()));
        };
        let get = |v: &Vec<(String, String)>, k: &str| v.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone());
        let note = |trail: &mut Vec<(String, Vec<String>)>, o: &str, place: &str| {
            match trail.iter_mut().find(|(a, _)| a == o) {
                Some((_, t)) if t.last().map(String::as_str) == Some(place) => {}
                Some((_, t)) => t.push(place.to_string()),
                None => trail.push((o.to_string(), vec![place.to_string()])),
            };
        };
        for fact in facts {
            let words: Vec<&str> = fact.trim_end_matches('.').split(' ').collect();
            if words[0] == "The" {
                relations.push((words[1].into(), words[3].into(), words[6].into()));
                continue;
            }
            let person = words[0];
            let last = *words.last().unwrap();
            if PLACES.contains(&last) {
                set(&mut place_of_person, person, last);
                for (o, h) in holder.clone() {
                    if h == person {
                        note(&mut trail, &o, last);
                    }
                }
            } else if last == "there" {
                let o = words[words.len() - 2];
                set(&mut holder, o, person);
                lying.retain(|(a, _)| a != o);
                note(&mut trail, o, &get(&place_of_person, person).unwrap());
            } else if OBJECTS.contains(&last) {
                holder.retain(|(a, _)| a != last);
                set(&mut lying, last, &get(&place_of_person, person).unwrap());
            } else {
                let o = words[words.len() - 3];
                set(&mut holder, o, last);
                gives.push((person.into(), o.into(), last.into()));
            }
        }
        let q: Vec<&str> = question.trim_end_matches('?').split(' ').collect();
        match (q[0], q[1]) {
            ("Where", "is") if q[2] == "the" => {
                get(&lying, q[3]).or_else(|| get(&place_of_person, &get(&holder, q[3]).unwrap())).unwrap()
            }
            ("Where", "is") => get(&place_of_person, q[2]).unwrap(),
            ("Where", "was") => {
                let t = &trail.iter().find(|(o, _)| o == q[3]).unwrap().1;
                let now = t.iter().position(|p| p == q[6]).unwrap();
                t[now - 1].clone()
            }
            ("What", "is") if q[2] == "the" => {
                let (place, dir) = (q[3], q[4]);
                let opposite = |d: &str| match d {
                    "north" => "south",
                    "south" => "north",
                    "east" => "west",
                    _ => "east",
                };
                relations.iter().find(|r| r.2 == place && r.1 == opposite(dir)).unwrap().0.clone()
            }
            ("What", "is") => relations.iter().find(|r| r.1 == q[2] && r.2 == q[5]).unwrap().0.clone(),
            ("What", "did") => gives.iter().rev().find(|g| g.0 == q[2] && g.2 == q[5]).unwrap().1.clone(),
            ("Who", "gave") if q.len() == 4 => gives.iter().rev().find(|g| g.1 == q[3]).unwrap().0.clone(),
            ("Who", "gave") => gives.iter().rev().find(|g| g.1 == q[3] && g.2 == q[5]).unwrap().0.clone(),
            ("Who", "received") => gives.iter().rev().find(|g| g.1 == q[3]).unwrap().2.clone(),
            ("Who", "did") => gives.iter().rev().find(|g| g.0 == q[2] && g.1 == q[5]).unwrap().2.clone(),
            _ => panic!("unread question {question}"),
        }
    }

    /// The facts of a sample's text: its sentences that are not the haystack's, between
    /// the instruction and the question.
    fn facts_of(text: &str, head: &str) -> Vec<String> {
        let context = &text[head.len()..text.rfind(" Question: ").unwrap()];
        let is_fact = |s: &&str| {
            let words: Vec<&str> = s.split(' ').collect();
            PEOPLE.contains(&words[0])
                || GIVERS.contains(&words[0])
                || (words[0] == "The" && words.len() > 1 && PLACES.contains(&words[1]))
        };
        context.split(". ").map(str::trim).filter(is_fact).map(|s| format!("{}.", s.trim_end_matches('.'))).collect()
    }

    #[test]
    fn every_answer_follows_by_rule_from_the_facts_in_the_text() {
        use super::super::{generate, ByteUnits, Spec, Units};
        for task in QA {
            for seed in 0..100 {
                let spec = Spec { length: 1600, depth: 0.0, text: None };
                let s = generate(task, &spec, &ByteUnits, &mut Rng::new(seed)).unwrap();
                let text = ByteUnits.decode(&s.input).unwrap();
                let question = text.rsplit(" Question: ").next().unwrap().trim_end_matches(" Answer:");
                let facts = facts_of(&text, instruction(task));
                assert_eq!(read(&facts, question), s.answers[0], "{task} seed {seed}: {facts:?} {question}");
                let Scoring::Only(others) = &s.scoring else { panic!("{task} is scored by label") };
                assert!(!others.contains(&s.answers[0]) && others.iter().all(|o| !question.contains(o.as_str())));
            }
        }
    }

    #[test]
    fn the_facts_keep_the_story_order() {
        for task in QA {
            for seed in 0..50 {
                let p = pieces(task, &mut Rng::new(seed));
                assert!(p.needles.windows(2).all(|w| w[0].depth <= w[1].depth), "{task}");
            }
        }
    }

    #[test]
    fn the_stories_are_as_long_as_babi_stories_and_every_form_is_asked() {
        let mut forms = std::collections::HashSet::new();
        for seed in 0..300 {
            for task in QA {
                let p = pieces(task, &mut Rng::new(seed));
                assert!((2..=16).contains(&p.needles.len()), "{task}: {}", p.needles.len());
                // The question's form: its words with the labels blanked out.
                let form: Vec<&str> = p
                    .tail
                    .trim_end_matches("? Answer:")
                    .split(' ')
                    .map(|w| {
                        let label =
                            [&PLACES[..], &OBJECTS, &GIVERS, &PEOPLE, &DIRECTIONS].iter().any(|l| l.contains(&w));
                        if label {
                            "X"
                        } else {
                            w
                        }
                    })
                    .collect();
                forms.insert(format!("{task}{}", form.join(" ")));
            }
        }
        // qa5's five forms, qa4's two and one for each other task.
        assert_eq!(forms.len(), 5 + 2 + 3, "{forms:?}");
    }
}
