"""MIB's IOI templates and word lists, as the benchmark's IOI data set was generated from them.

    from hookrun.data.mib_ioi import TEMPLATES, NAMES
    TEMPLATES[0].format(name_A="Mary", name_B="John", name_C="John", place="store", object="drink")

Source: tasks/IOI_task/templates.json, names.json, objects.json and places.json of atticusg/CausalAbstraction
(commit 6e594151829102741e4a7d5703de9f43957e36a4), the code of MIB's causal variable track (Mueller et al.
2025), whose IOI task reads the same rows as MIB's circuit track (Hugging Face `mib-bench/ioi`, also
`mech-interp-bench/ioi`). Copied verbatim, in their order. A template has the slots {name_A}, {name_B},
{name_C} (the subject's second mention: name_C is name_A or name_B, the indirect object the other) and, in
most, {place} and {object}; hookrun/data/mib.py's `ioi_rows` fills them.
"""

from __future__ import annotations

TEMPLATES = (
    "After the lunch, {name_A} and {name_B} went to the {place}. {name_C} gave a {object} to",
    "After the lunch, {name_A} and {name_B} went to the {place}. {name_C} gave an {object} to",
    "After {name_A} and {name_B} went to the {place}, {name_C} gave a {object} to",
    "After {name_A} and {name_B} went to the {place}, {name_C} gave an {object} to",
    "After {name_A} and {name_B} spent some time at the {place}, {name_C} offered a {object} to",
    "After {name_A} and {name_B} spent some time at the {place}, {name_C} offered an {object} to",
    "After {name_A} and {name_B} finished their work at the {place}, {name_C} gave a {object} to",
    "After {name_A} and {name_B} finished their work at the {place}, {name_C} gave an {object} to",
    "After {name_A} and {name_B} went to the {place}, {name_C} handed a {object} to",
    "After {name_A} and {name_B} went to the {place}, {name_C} handed an {object} to",
    "Afterwards, {name_A} and {name_B} went to the {place}. {name_C} gave a {object} to",
    "Afterwards, {name_A} and {name_B} went to the {place}. {name_C} gave an {object} to",
    "As {name_A} and {name_B} left the {place}, {name_C} gave a {object} to",
    "As {name_A} and {name_B} left the {place}, {name_C} gave an {object} to",
    "At the {place}, {name_A} and {name_B} found a {object}. {name_C} gave it to",
    "Before {name_A} and {name_B} left the {place}, {name_C} decided to give a {object} to",
    "Before {name_A} and {name_B} left the {place}, {name_C} decided to give an {object} to",
    "Friends {name_A} and {name_B} found a {object} at the {place}. {name_C} gave it to",
    "Friends {name_A} and {name_B} found an {object} at the {place}. {name_C} gave it to",
    "Just as {name_A} and {name_B} were leaving the {place}, {name_C} offered a {object} to",
    "Just as {name_A} and {name_B} were leaving the {place}, {name_C} offered an {object} to",
    "Later, {name_A} and {name_B} met at the {place}. {name_C} bought a {object} for",
    "Later, {name_A} and {name_B} met at the {place}. {name_C} bought an {object} for",
    "{name_A} and {name_B} walked to the {place}. {name_C} gave a {object} to",
    "{name_A} and {name_B} walked to the {place}. {name_C} gave an {object} to",
    "{name_A} and {name_B} decided to visit the {place}. Then, {name_C} gave a {object} to",
    "{name_A} and {name_B} decided to visit the {place}. Then, {name_C} gave an {object} to",
    "{name_A} and {name_B} were sitting together. {name_C} handed over a {object} to",
    "{name_A} and {name_B} were sitting together. {name_C} handed over an {object} to",
    "{name_A} and {name_B} were sitting at the {place}. {name_C} handed over a {object} to",
    "{name_A} and {name_B} were sitting at the {place}. {name_C} handed over an {object} to",
    "{name_A} and {name_B} were working together. {name_C} gave a {object} to",
    "{name_A} and {name_B} were working together. {name_C} gave an {object} to",
    "{name_A} and {name_B} went to the {place}. Then, {name_C} handed a {object} to",
    "{name_A} and {name_B} went to the {place}. Then, {name_C} handed an {object} to",
    "{name_A} and {name_B} were working at the {place}. Then, {name_C} decided to give a {object} to",
    "{name_A} and {name_B} were working at the {place}. Then, {name_C} decided to give an {object} to",
    "{name_A} and {name_B} were thinking about going to the {place}. {name_C} wanted to give a {object} to",
    "{name_A} and {name_B} were thinking about going to the {place}. {name_C} wanted to give an {object} to",
    "{name_A} and {name_B} had a lot of fun at the {place}. {name_C} gave a {object} to",
    "{name_A} and {name_B} had a lot of fun at the {place}. {name_C} gave an {object} to",
    "Once {name_A} and {name_B} finished at the {place}, {name_C} gave a {object} to",
    "Once {name_A} and {name_B} finished at the {place}, {name_C} gave an {object} to",
    "Once {name_A} and {name_B} arrived at the {place}, {name_C} gave a {object} to",
    "Once {name_A} and {name_B} arrived at the {place}, {name_C} gave an {object} to",
    "Then, {name_A} and {name_B} went to the {place}. {name_C} gave a {object} to",
    "Then, {name_A} and {name_B} went to the {place}. {name_C} gave an {object} to",
    "Then, {name_A} and {name_B} had a lot of fun at the {place}. {name_C} gave a {object} to",
    "Then, {name_A} and {name_B} had a lot of fun at the {place}. {name_C} gave an {object} to",
    "Then, {name_A} and {name_B} were working at the {place}. {name_C} decided to give a {object} to",
    "Then, {name_A} and {name_B} were working at the {place}. {name_C} decided to give an {object} to",
    "Then, {name_A} and {name_B} were thinking about going to the {place}. {name_C} wanted to give a {object} to",
    "Then, {name_A} and {name_B} were thinking about going to the {place}. {name_C} wanted to give an {object} to",
    "Then, {name_A} and {name_B} had a long argument, and afterwards {name_C} said to",
    "Then, {name_A} and {name_B} had a long argument. Afterwards {name_C} said to",
    "The {place} {name_A} and {name_B} went to had a {object}. {name_C} gave it to",
    "When {name_A} and {name_B} got a {object} at the {place}, {name_C} decided to give it to",
    "When {name_A} and {name_B} got a {object} at the {place}, {name_C} decided to give the {object} to",
    "When {name_A} and {name_B} were done exploring the {place}, {name_C} decided to give a {object} to",
    "When {name_A} and {name_B} were about to leave the {place}, {name_C} gave a {object} to",
    "While {name_A} and {name_B} were working at the {place}, {name_C} gave a {object} to",
    "While {name_A} and {name_B} were working at the {place}, {name_C} gave an {object} to",
    "While {name_A} and {name_B} were commuting to the {place}, {name_C} gave a {object} to",
    "While {name_A} and {name_B} were commuting to the {place}, {name_C} gave an {object} to",
    "While {name_A} and {name_B} relaxed at the {place}, {name_C} presented a {object} to",
    "While {name_A} and {name_B} relaxed at the {place}, {name_C} presented an {object} to",
    "While {name_A} and {name_B} relaxed, {name_C} gave a {object} to",
    "While {name_A} and {name_B} relaxed, {name_C} gave an {object} to",
    "While {name_A} and {name_B} were playing at the {place}, {name_C} gave a {object} to",
    "While {name_A} and {name_B} were playing at the {place}, {name_C} gave an {object} to",
)

NAMES = (
    "Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda", "Daniel", "David",
    "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon", "Jason", "Justin", "Sarah", "William",
    "Jonathan", "Stephanie", "Brian", "Nicole", "Nicholas", "Anthony", "Heather", "Eric", "Elizabeth", "Adam",
    "Megan", "Melissa", "Kevin", "Steven", "Thomas", "Timothy", "Christina", "Kyle", "Rachel", "Laura", "Lauren",
    "Amber", "Brittany", "Danielle", "Richard", "Kimberly", "Jeffrey", "Amy", "Crystal", "Michelle", "Tiffany",
    "Jeremy", "Benjamin", "Mark", "Emily", "Aaron", "Charles", "Rebecca", "Jacob", "Stephen", "Patrick", "Sean",
    "Erin", "Jamie", "Kelly", "Samantha", "Nathan", "Sara", "Dustin", "Paul", "Angela", "Tyler", "Scott", "Katherine",
    "Andrea", "Gregory", "Erica", "Mary", "Travis", "Lisa", "Kenneth", "Bryan", "Lindsey", "Kristen", "Jose",
    "Alexander", "Jesse", "Katie", "Lindsay", "Shannon", "Vanessa", "Courtney", "Christine", "Alicia", "Cody",
    "Allison", "Bradley", "Samuel",
)

OBJECTS = (
    "ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack",
)

PLACES = (
    "store", "garden", "restaurant", "school", "hospital", "office", "house", "station",
)
