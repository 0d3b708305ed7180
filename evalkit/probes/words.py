"""Word lists of the built-in tasks: keys, values and chat phrases.

They are also part of the tiny tokenizer's training text (model_adapters/build_tokenizer.py), so a
change here changes that tokenizer.
"""

# The repeated-filler haystack: the classic passkey-retrieval filler (see data/LICENSE.md).
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

CITIES = (
    "Lisbon", "Paris", "Oslo", "Cairo", "Lima", "Quito", "Dakar", "Hanoi", "Kyoto", "Seville",
    "Porto", "Dublin", "Vienna", "Prague", "Warsaw", "Riga", "Tallinn", "Helsinki", "Bergen",
    "Geneva", "Zurich", "Munich", "Hamburg", "Antwerp", "Utrecht", "Bruges", "Lyon", "Nantes",
    "Bordeaux", "Marseille", "Naples", "Turin", "Verona", "Palermo", "Valencia", "Bilbao",
    "Granada", "Malaga", "Athens", "Sofia", "Bucharest", "Belgrade", "Zagreb", "Split",
    "Krakow", "Gdansk", "Vilnius", "Minsk", "Kyiv", "Odesa", "Tbilisi", "Yerevan", "Baku",
    "Tehran", "Muscat", "Doha", "Amman", "Beirut", "Tunis", "Algiers", "Rabat", "Accra",
    "Lagos", "Nairobi", "Kampala", "Lusaka", "Harare", "Maputo", "Durban", "Windhoek",
    "Mumbai", "Delhi", "Chennai", "Dhaka", "Kathmandu", "Colombo", "Yangon", "Bangkok",
    "Manila", "Jakarta", "Surabaya", "Perth", "Adelaide", "Hobart", "Auckland", "Wellington",
    "Osaka", "Sapporo", "Busan", "Seoul", "Taipei", "Macau", "Denver", "Austin", "Boston",
    "Chicago", "Seattle", "Portland", "Toronto", "Montreal", "Halifax", "Havana", "Bogota",
    "Caracas", "Santiago", "Montevideo", "Asuncion", "Recife", "Salvador", "Cusco",
)

# Word values: concrete nouns; any that occur in the prose haystack are dropped at load time,
# so a word value is never confused with haystack text.
VALUE_WORDS = (
    "anchor", "apricot", "avalanche", "badger", "bagpipe", "balcony", "bamboo", "banjo",
    "barometer", "basil", "beacon", "biscuit", "blizzard", "bonfire", "boulder", "bracelet",
    "bramble", "bucket", "cactus", "canoe", "canyon", "caravan", "cardigan", "carousel",
    "cashew", "cathedral", "cello", "chestnut", "cinnamon", "clarinet", "cobalt", "compass",
    "copper", "coral", "cricket", "cymbal", "dolphin", "dragonfly", "drizzle", "dynamo",
    "eclipse", "emerald", "falcon", "ferry", "fjord", "flannel", "fossil", "galaxy",
    "gazebo", "geyser", "ginger", "glacier", "gondola", "granite", "harbor", "harpoon",
    "hazelnut", "helmet", "hammock", "iceberg", "igloo", "jasmine", "javelin", "jigsaw",
    "juniper", "kayak", "kettledrum", "kiwi", "lagoon", "lantern", "lava", "lemonade",
    "lighthouse", "limestone", "lobby", "magnet", "mango", "marble", "meadowlark", "meteor",
    "monsoon", "mosaic", "nectar", "nutmeg", "oasis", "octopus", "orchid", "origami",
    "paddle", "pagoda", "panther", "papaya", "parsley", "pebble", "pelican", "penguin",
    "pepperoni", "piano", "pistachio", "planet", "plum", "pretzel", "pumpkin", "quartz",
    "quilt", "raccoon", "radar", "raft", "rocket", "saddle", "saffron", "sapphire",
    "scooter", "seashell", "sequoia", "sherbet", "skateboard", "sleigh", "snorkel",
    "spinach", "sponge", "squirrel", "starfish", "sundial", "sunflower", "tambourine",
    "tangerine", "telescope", "thunder", "tornado", "tractor", "trombone", "trumpet",
    "tulip", "tundra", "turquoise", "umbrella", "vanilla", "velvet", "violin", "volcano",
    "walnut", "walrus", "wigwam", "windmill", "yacht", "yogurt", "zebra", "zeppelin",
    "zucchini",
)

# Natural-language key domains: (attribute, plural attribute, noun): "the code for locker 12".
DOMAINS = (
    ("code", "codes", "locker"),
    ("passcode", "passcodes", "vault"),
    ("combination", "combinations", "safe"),
    ("extension", "extensions", "desk"),
    ("ticket number", "ticket numbers", "seat"),
    ("access code", "access codes", "gate"),
)

# Synthetic (MQAR-like) keys are consonant-vowel pseudo-words such as "zuvo".
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"

# Chat phrases.
FACT_INTROS = ("Please remember this.", "Keep this in mind.", "Note this down for later.")
UPDATE_INTROS = ("Correction, this has changed.", "Update, it is different now.")
FACT_ACKS = ("Noted.", "Got it.", "Understood, I will remember.")
UPDATE_ACKS = ("Noted, I have updated it.", "Thanks for the update.")
STORY_REQUESTS = ("Tell me more of the story.", "Please go on with the story.",
                  "What happens next?", "Continue, please.")
