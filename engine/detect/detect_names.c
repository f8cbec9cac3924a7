/* Built-in free-text recognizer ("names"): people, organisations, places,
 * street addresses, ages and titles in prose, found by a hand-written
 * scanner over UTF-8 words -- no regexes, so no backtracking.
 *
 * Why a scanner and not patterns: the evidence for a name is the shape of
 * the words around it (capitalised, not at a sentence start, after a cue,
 * before a street type), and one left-to-right pass over a word array sees
 * all of it in time linear in the message.  Every lookahead is bounded by a
 * constant number of words, and the word array is a fixed window
 * (WINDOW words, reused), so memory does not grow with the message either.
 *
 * A false positive here only keeps some user text private (less KV shared);
 * a false negative shares a person's name.  The rules lean to recall, with a
 * small list of capitalised words that are never names (days, months, "I",
 * sentence-start function words) to keep ordinary sentences shareable.
 *
 * The chain's per-role policy decides which messages reach it: by default
 * user and assistant turns only (documents and system prompts are public). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "../../kernels/fileio.h"
#include "../../tokenizer/utf8.h"
#include "detect.h"

/* ---- the lexicon ------------------------------------------------------------ */

enum {
    L_STOP = 1 << 0,     /* capitalised, never a name: days, months, "I" */
    L_FUNC = 1 << 1,     /* function / sentence-start word: dropped from a run's start */
    L_HONOR = 1 << 2,    /* Mr, Dr, Prof ...: the next capitalised words are a person */
    L_PARTICLE = 1 << 3, /* van, de, of ...: joins two capitalised words */
    L_ORG = 1 << 4,      /* Inc, Ltd, University ...: the run is an organisation */
    L_PLACE = 1 << 5,    /* City, River, North ...: the run is a place */
    L_LOCCUE = 1 << 6,   /* in, from, near ...: a run right after it is a place */
    L_STREET = 1 << 7,   /* Street, Rd, Strasse ...: after a number and names */
    L_STREETPRE = 1 << 8, /* Via, Rue, ul. ...: before names and a number */
    L_UNIT = 1 << 9,     /* Apt, Suite, Box ...: before a number */
    L_ABBR = 1 << 10,    /* a '.' after it does not end the sentence */
    L_AGECUE = 1 << 11,  /* aged, turned ...: before a number that is an age */
    /* single words of the cue phrases (my name is X, call me X, I am X, 34 years old) */
    K_IS = 1 << 12, K_NAME = 1 << 13, K_ME = 1 << 14, K_CALL = 1 << 15, K_AM = 1 << 16, K_I = 1 << 17, K_IM = 1 << 18,
    K_NAMED = 1 << 19, K_YEARS = 1 << 20, K_OLD = 1 << 21,
    K_SAYS = 1 << 23, /* said, replied, lives ...: a verb whose subject is most often a person */
    K_AND = 1 << 30,  /* and: Clark, Romero and Hall (a firm), Usamov and Bowers (two people) */
    L_ROLE = 1 << 22, /* Manager, Professor, Sir ...: a run of only these (and initials) names a role, no one */
    L_COMPOUND = 1 << 24, /* set per word, not listed: a capitalised word ending in a street type */
    L_GAZ = 1 << 25,      /* a country or a major place (the gazetteer below): a place wherever it stands */
    L_GAZLC = 1 << 26,    /* ... and no ordinary English word, so a place in lowercase too (i'm from france) */
    L_SHIP = 1 << 27,     /* USNS, USNV, USS, USCGC: a US military address is a ship's name */
    L_ADDRCUE = 1 << 28,  /* at, on, to, of, lives ...: capitalised words and a number after it are an address */
    L_LEGAL = 1 << 29,    /* inc, ltd, llc ...: a legal suffix, an organisation even in lowercase */
};

typedef struct lex_entry {
    const char *w; /* lowercase */
    uint32_t f;
} lex_entry;

#define FN L_FUNC
#define HA (L_HONOR | L_ABBR)
static const lex_entry lexicon[] = {
    /* cue words (flags merge with the word's other entries) */
    { "is", K_IS }, { "name", K_NAME }, { "me", K_ME }, { "call", K_CALL }, { "am", K_AM }, { "i", K_I },
    { "i'm", K_IM }, { "i\xe2\x80\x99m", K_IM }, { "named", K_NAMED }, { "called", K_NAMED }, { "years", K_YEARS },
    { "year", K_YEARS }, { "yrs", K_YEARS }, { "yo", K_YEARS }, { "old", K_OLD },
    { "said", K_SAYS }, { "says", K_SAYS }, { "asked", K_SAYS }, { "replied", K_SAYS }, { "told", K_SAYS },
    { "lives", K_SAYS }, { "lived", K_SAYS }, { "works", K_SAYS }, { "worked", K_SAYS }, { "wrote", K_SAYS },
    { "married", K_SAYS }, { "spent", K_SAYS }, { "shouted", K_SAYS }, { "smiled", K_SAYS }, { "laughed", K_SAYS },
    /* never names when capitalised */
    { "i", L_STOP }, { "i'm", L_STOP }, { "i\xe2\x80\x99m", L_STOP }, { "i'd", L_STOP }, { "i've", L_STOP },
    { "i'll", L_STOP }, { "monday", L_STOP }, { "tuesday", L_STOP }, { "wednesday", L_STOP }, { "thursday", L_STOP },
    { "friday", L_STOP }, { "saturday", L_STOP }, { "sunday", L_STOP }, { "mon", L_STOP | L_ABBR },
    { "tue", L_STOP | L_ABBR }, { "tues", L_STOP | L_ABBR }, { "wed", L_STOP | L_ABBR }, { "thu", L_STOP | L_ABBR },
    { "thurs", L_STOP | L_ABBR }, { "fri", L_STOP | L_ABBR }, { "sat", L_STOP | L_ABBR }, { "sun", L_STOP | L_ABBR },
    { "january", L_STOP }, { "february", L_STOP }, { "march", L_STOP }, { "april", L_STOP }, { "may", L_STOP | FN },
    { "june", L_STOP }, { "july", L_STOP }, { "august", L_STOP }, { "september", L_STOP }, { "october", L_STOP },
    { "november", L_STOP }, { "december", L_STOP }, { "jan", L_STOP | L_ABBR }, { "feb", L_STOP | L_ABBR },
    { "mar", L_STOP | L_ABBR }, { "apr", L_STOP | L_ABBR }, { "jun", L_STOP | L_ABBR }, { "jul", L_STOP | L_ABBR },
    { "aug", L_STOP | L_ABBR }, { "sep", L_STOP | L_ABBR }, { "sept", L_STOP | L_ABBR }, { "oct", L_STOP | L_ABBR },
    { "nov", L_STOP | L_ABBR }, { "dec", L_STOP | L_ABBR }, { "ok", L_STOP }, { "okay", L_STOP | FN },
    { "christmas", L_STOP }, { "easter", L_STOP }, { "yes", L_STOP | FN }, { "no", L_STOP | FN | L_ABBR },
    { "oh", L_STOP | FN }, { "hi", L_STOP | FN }, { "hello", L_STOP | FN }, { "hey", L_STOP | FN },
    { "thanks", L_STOP | FN }, { "please", L_STOP | FN }, { "sorry", L_STOP | FN },
    /* function and sentence-start words */
    { "the", FN }, { "a", FN }, { "an", FN }, { "this", FN }, { "that", FN }, { "these", FN }, { "those", FN },
    { "my", FN }, { "your", FN }, { "his", FN }, { "her", FN }, { "our", FN }, { "their", FN }, { "its", FN },
    { "it", FN }, { "it's", FN }, { "we", FN }, { "you", FN }, { "he", FN }, { "she", FN }, { "they", FN },
    { "me", FN }, { "us", FN }, { "him", FN }, { "them", FN }, { "there", FN }, { "here", FN }, { "what", FN },
    { "when", FN }, { "where", FN }, { "why", FN }, { "how", FN }, { "who", FN }, { "whom", FN }, { "whose", FN },
    { "which", FN }, { "while", FN }, { "if", FN }, { "in", FN | L_LOCCUE }, { "on", FN | L_ADDRCUE }, { "at", FN | L_LOCCUE | L_ADDRCUE },
    { "for", FN }, { "from", FN | L_LOCCUE }, { "to", FN | L_ADDRCUE }, { "of", FN | L_PARTICLE | L_ADDRCUE }, { "by", FN }, { "with", FN },
    { "without", FN }, { "about", FN }, { "after", FN }, { "before", FN }, { "during", FN }, { "since", FN },
    { "until", FN }, { "and", FN }, { "but", FN }, { "or", FN }, { "nor", FN }, { "so", FN }, { "as", FN },
    { "because", FN }, { "although", FN }, { "though", FN }, { "however", FN }, { "also", FN }, { "then", FN },
    { "now", FN }, { "just", FN }, { "only", FN }, { "even", FN }, { "still", FN }, { "yet", FN }, { "not", FN },
    { "all", FN }, { "some", FN }, { "any", FN }, { "every", FN }, { "each", FN }, { "both", FN }, { "either", FN },
    { "neither", FN }, { "many", FN }, { "much", FN }, { "more", FN }, { "most", FN }, { "other", FN },
    { "another", FN }, { "such", FN }, { "can", FN }, { "could", FN }, { "would", FN }, { "should", FN },
    { "will", FN }, { "shall", FN }, { "might", FN }, { "must", FN }, { "do", FN | L_PARTICLE }, { "does", FN },
    { "did", FN }, { "don't", FN }, { "is", FN }, { "are", FN }, { "was", FN }, { "were", FN }, { "be", FN },
    { "been", FN }, { "am", FN }, { "has", FN }, { "have", FN }, { "had", FN }, { "let", FN }, { "let's", FN },
    { "thank", FN }, { "dear", FN }, { "good", FN }, { "great", FN }, { "well", FN }, { "sure", FN },
    { "maybe", FN }, { "perhaps", FN }, { "today", FN }, { "tomorrow", FN }, { "yesterday", FN }, { "tonight", FN },
    { "one", FN }, { "two", FN }, { "three", FN }, { "first", FN }, { "second", FN }, { "last", FN }, { "next", FN },
    { "there's", FN }, { "what's", FN }, { "that's", FN }, { "here's", FN }, { "where's", FN }, { "how's", FN },
    { "who's", FN }, { "isn't", FN }, { "aren't", FN }, { "wasn't", FN }, { "can't", FN }, { "won't", FN },
    { "didn't", FN }, { "doesn't", FN }, { "note", FN }, { "see", FN }, { "check", FN }, { "find", FN },
    { "get", FN }, { "give", FN }, { "tell", FN }, { "show", FN }, { "send", FN }, { "ask", FN }, { "make", FN },
    { "take", FN }, { "use", FN }, { "write", FN }, { "read", FN }, { "help", FN }, { "call", FN }, { "go", FN },
    { "come", FN }, { "look", FN }, { "try", FN }, { "keep", FN }, { "put", FN }, { "say", FN }, { "summarize", FN },
    { "summarise", FN }, { "explain", FN }, { "describe", FN }, { "list", FN }, { "compare", FN },
    { "translate", FN }, { "answer", FN }, { "according", FN }, { "based", FN | L_LOCCUE }, { "given", FN },
    { "using", FN }, { "regarding", FN }, { "once", FN }, { "again", FN }, { "later", FN }, { "soon", FN },
    { "never", FN }, { "always", FN }, { "often", FN }, { "sometimes", FN }, { "usually", FN }, { "really", FN },
    { "actually", FN }, { "nobody", FN }, { "everyone", FN }, { "everybody", FN }, { "someone", FN },
    { "somebody", FN }, { "anyone", FN }, { "nothing", FN }, { "everything", FN }, { "something", FN },
    { "anything", FN }, { "why's", FN }, { "we're", FN }, { "you're", FN }, { "they're", FN }, { "we've", FN },
    { "you've", FN }, { "he's", FN }, { "she's", FN }, { "could", FN }, { "yours", FN }, { "regards", FN },
    { "best", FN }, { "hope", FN }, { "sincerely", FN }, { "cheers", FN }, { "attached", FN }, { "sent", FN },
    { "new", 0 },
    /* roles and common capitalised nouns: speaker labels (Project Manager:,
     * Grad C:), salutations (Dear Sir or Madam) */
    { "project", L_ROLE }, { "manager", L_ROLE }, { "industrial", L_ROLE }, { "designer", L_ROLE },
    { "user", L_ROLE }, { "interface", L_ROLE }, { "marketing", L_ROLE }, { "grad", L_ROLE }, { "phd", L_ROLE },
    { "postdoc", L_ROLE }, { "undergrad", L_ROLE }, { "student", L_ROLE }, { "madam", L_ROLE }, { "yeah", L_ROLE },
    { "team", L_ROLE }, { "chair", L_ROLE }, { "chairman", L_ROLE }, { "chairperson", L_ROLE }, { "member", L_ROLE },
    { "members", L_ROLE }, { "customer", L_ROLE }, { "client", L_ROLE }, { "speaker", L_ROLE }, { "friend", L_ROLE },
    { "friends", L_ROLE }, { "colleague", L_ROLE }, { "colleagues", L_ROLE }, { "reader", L_ROLE },
    { "internet", L_ROLE }, { "government", L_ROLE }, { "minister", L_ROLE }, { "prime", L_ROLE },
    { "auditor", L_ROLE }, { "general", L_ROLE }, { "secretary", L_ROLE }, { "director", L_ROLE },
    { "doctor", L_ROLE }, { "father", L_ROLE }, { "mother", L_ROLE }, { "mum", L_ROLE }, { "mom", L_ROLE },
    { "dad", L_ROLE }, { "hiring", L_ROLE }, { "all", L_ROLE },
    /* honorifics and titles */
    { "mr", HA }, { "mrs", HA }, { "ms", HA }, { "miss", L_HONOR }, { "mx", HA }, { "dr", HA }, { "prof", HA },
    { "professor", L_HONOR }, { "sir", L_HONOR }, { "dame", L_HONOR }, { "lord", L_HONOR }, { "lady", L_HONOR },
    { "rev", HA }, { "reverend", L_HONOR }, { "fr", HA }, { "capt", HA }, { "captain", L_HONOR }, { "sgt", HA },
    { "sergeant", L_HONOR }, { "col", HA }, { "colonel", L_HONOR }, { "lt", HA }, { "lieutenant", L_HONOR },
    { "judge", L_HONOR }, { "uncle", L_HONOR }, { "aunt", L_HONOR }, { "auntie", L_HONOR }, { "mme", HA },
    { "mlle", HA }, { "herr", L_HONOR }, { "frau", L_HONOR }, { "senor", L_HONOR }, { "se\xc3\xb1or", L_HONOR },
    { "se\xc3\xb1ora", L_HONOR }, { "sra", HA }, { "president", L_HONOR }, { "senator", L_HONOR },
    { "governor", L_HONOR }, { "mayor", L_HONOR }, { "officer", L_HONOR }, { "detective", L_HONOR },
    { "inspector", L_HONOR }, { "nurse", L_HONOR }, { "coach", L_HONOR }, { "jr", L_ABBR }, { "sr", L_ABBR },
    /* name particles */
    { "van", L_PARTICLE }, { "von", L_PARTICLE }, { "de", L_PARTICLE }, { "der", L_PARTICLE }, { "den", L_PARTICLE },
    { "del", L_PARTICLE }, { "della", L_PARTICLE }, { "di", L_PARTICLE }, { "da", L_PARTICLE }, { "das", L_PARTICLE },
    { "dos", L_PARTICLE }, { "du", L_PARTICLE }, { "des", L_PARTICLE }, { "le", L_PARTICLE }, { "la", L_PARTICLE },
    { "bin", L_PARTICLE }, { "binti", L_PARTICLE }, { "ibn", L_PARTICLE }, { "bint", L_PARTICLE },
    { "al", L_PARTICLE | L_STREETPRE | L_ABBR }, { "el", L_PARTICLE }, { "ter", L_PARTICLE }, { "ten", L_PARTICLE },
    { "zu", L_PARTICLE }, { "y", L_PARTICLE },
    /* organisations */
    { "inc", L_ORG | L_ABBR }, { "ltd", L_ORG | L_ABBR }, { "llc", L_ORG }, { "llp", L_ORG }, { "plc", L_ORG },
    { "gmbh", L_ORG }, { "ag", L_ORG }, { "sa", L_ORG }, { "sas", L_ORG }, { "sarl", L_ORG }, { "srl", L_ORG },
    { "spa", L_ORG }, { "bv", L_ORG }, { "nv", L_ORG }, { "oy", L_ORG }, { "ab", L_ORG }, { "asa", L_ORG },
    { "pty", L_ORG }, { "corp", L_ORG | L_ABBR }, { "corporation", L_ORG }, { "co", L_ORG | L_ABBR },
    { "company", L_ORG }, { "group", L_ORG }, { "holdings", L_ORG }, { "associates", L_ORG }, { "partners", L_ORG },
    { "bank", L_ORG }, { "university", L_ORG }, { "college", L_ORG }, { "institute", L_ORG }, { "school", L_ORG },
    { "academy", L_ORG }, { "foundation", L_ORG }, { "trust", L_ORG }, { "hospital", L_ORG }, { "clinic", L_ORG },
    { "council", L_ORG }, { "ministry", L_ORG }, { "department", L_ORG }, { "dept", L_ORG | L_ABBR },
    { "agency", L_ORG }, { "authority", L_ORG }, { "association", L_ORG }, { "society", L_ORG }, { "club", L_ORG },
    { "federation", L_ORG }, { "technologies", L_ORG }, { "technology", L_ORG }, { "solutions", L_ORG },
    { "systems", L_ORG }, { "labs", L_ORG }, { "laboratories", L_ORG }, { "software", L_ORG },
    { "industries", L_ORG }, { "services", L_ORG }, { "consulting", L_ORG }, { "media", L_ORG },
    { "research", L_ORG }, { "press", L_ORG }, { "airlines", L_ORG }, { "airways", L_ORG }, { "motors", L_ORG },
    { "energy", L_ORG }, { "capital", L_ORG }, { "insurance", L_ORG }, { "pharmaceuticals", L_ORG },
    { "entertainment", L_ORG }, { "studios", L_ORG }, { "ventures", L_ORG }, { "networks", L_ORG },
    { "analytics", L_ORG }, { "logistics", L_ORG }, { "enterprises", L_ORG }, { "limited", L_ORG },
    { "incorporated", L_ORG }, { "museum", L_ORG }, { "library", L_ORG }, { "commission", L_ORG },
    { "committee", L_ORG }, { "bureau", L_ORG }, { "markets", L_ORG }, { "finance", L_ORG }, { "data", L_ORG },
    /* places */
    { "city", L_PLACE }, { "county", L_PLACE }, { "province", L_PLACE }, { "republic", L_PLACE },
    { "kingdom", L_PLACE }, { "island", L_PLACE }, { "islands", L_PLACE }, { "isle", L_PLACE },
    { "mountains", L_PLACE }, { "mount", L_PLACE }, { "mt", L_PLACE | L_ABBR }, { "river", L_PLACE },
    { "lake", L_PLACE }, { "valley", L_PLACE }, { "bay", L_PLACE }, { "beach", L_PLACE }, { "coast", L_PLACE },
    { "district", L_PLACE }, { "region", L_PLACE }, { "north", L_PLACE }, { "south", L_PLACE }, { "east", L_PLACE },
    { "west", L_PLACE }, { "san", L_PLACE }, { "santa", L_PLACE }, { "port", L_PLACE }, { "fort", L_PLACE },
    { "ft", L_PLACE | L_ABBR },
    /* words before a place */
    { "near", L_LOCCUE }, { "into", L_LOCCUE }, { "visit", L_LOCCUE }, { "visited", L_LOCCUE },
    { "visiting", L_LOCCUE }, { "across", L_LOCCUE }, { "outside", L_LOCCUE }, { "around", L_LOCCUE },
    { "towards", L_LOCCUE }, { "toward", L_LOCCUE }, { "via", L_LOCCUE | L_STREETPRE }, { "born", L_LOCCUE },
    { "live", L_LOCCUE }, { "lives", L_LOCCUE }, { "lived", L_LOCCUE }, { "living", L_LOCCUE },
    { "moved", L_LOCCUE }, { "arrived", L_LOCCUE }, { "travelled", L_LOCCUE }, { "traveled", L_LOCCUE },
    /* street types after the name */
    { "street", L_STREET }, { "st", L_STREET | L_ABBR }, { "road", L_STREET }, { "rd", L_STREET | L_ABBR },
    { "avenue", L_STREET | L_STREETPRE }, { "ave", L_STREET | L_ABBR }, { "av", L_STREET | L_STREETPRE | L_ABBR },
    { "lane", L_STREET }, { "ln", L_STREET | L_ABBR }, { "drive", L_STREET }, { "way", L_STREET },
    { "court", L_STREET }, { "ct", L_STREET | L_ABBR }, { "place", L_STREET }, { "pl", L_STREET | L_ABBR },
    { "boulevard", L_STREET | L_STREETPRE }, { "blvd", L_STREET | L_ABBR }, { "terrace", L_STREET },
    { "parkway", L_STREET }, { "pkwy", L_STREET | L_ABBR }, { "circle", L_STREET }, { "cir", L_STREET | L_ABBR },
    { "highway", L_STREET }, { "hwy", L_STREET | L_ABBR }, { "square", L_STREET }, { "sq", L_STREET | L_ABBR },
    { "trail", L_STREET }, { "crescent", L_STREET }, { "close", L_STREET }, { "row", L_STREET },
    { "grove", L_STREET }, { "gardens", L_STREET }, { "mews", L_STREET }, { "walk", L_STREET }, { "alley", L_STREET },
    { "plaza", L_STREET | L_STREETPRE }, { "pike", L_STREET }, { "strasse", L_STREET },
    { "stra\xc3\x9f" "e", L_STREET }, { "str", L_STREET | L_STREETPRE | L_ABBR }, { "gasse", L_STREET },
    { "weg", L_STREET }, { "allee", L_STREET }, { "platz", L_STREET }, { "vej", L_STREET }, { "gade", L_STREET },
    { "gatan", L_STREET }, { "v\xc3\xa4gen", L_STREET }, { "laan", L_STREET }, { "straat", L_STREET },
    { "plein", L_STREET }, { "\xc3\xbat", L_STREET }, { "utca", L_STREET }, { "t\xc3\xa9r", L_STREET },
    { "ulica", L_STREET | L_STREETPRE }, { "cesta", L_STREET }, { "iela", L_STREET }, { "katu", L_STREET },
    { "vei", L_STREET }, { "veien", L_STREET },
    /* street types before the name */
    { "viale", L_STREETPRE }, { "piazza", L_STREETPRE }, { "piazzale", L_STREETPRE }, { "corso", L_STREETPRE },
    { "largo", L_STREETPRE }, { "vicolo", L_STREETPRE }, { "rue", L_STREETPRE }, { "avda", L_STREETPRE | L_ABBR },
    { "avenida", L_STREETPRE }, { "calle", L_STREETPRE }, { "carrer", L_STREETPRE }, { "rua", L_STREETPRE },
    { "pra\xc3\xa7" "a", L_STREETPRE }, { "travessa", L_STREETPRE }, { "paseo", L_STREETPRE },
    { "camino", L_STREETPRE }, { "ul", L_STREETPRE | L_ABBR }, { "aleja", L_STREETPRE }, { "plac", L_STREETPRE },
    { "strada", L_STREETPRE }, { "bulevar", L_STREETPRE }, { "chemin", L_STREETPRE }, { "route", L_STREETPRE },
    /* address cues (merged with the entries above); ships; legal suffixes */
    { "and", K_AND }, { "lives", L_ADDRCUE }, { "located", L_ADDRCUE }, { "address", L_ADDRCUE }, { "usns", L_SHIP },
    { "usnv", L_SHIP }, { "uss", L_SHIP }, { "uscgc", L_SHIP }, { "inc", L_LEGAL }, { "ltd", L_LEGAL },
    { "llc", L_LEGAL }, { "llp", L_LEGAL }, { "plc", L_LEGAL }, { "gmbh", L_LEGAL }, { "corp", L_LEGAL },
    /* street types written in lowercase after the name (Hungarian, Norwegian, Greek transliterated) */
    { "u", L_STREET | L_ABBR }, { "utca", L_STREET }, { "\xc3\xbat", L_STREET }, { "\xc3\xbatja", L_STREET },
    { "t\xc3\xa9r", L_STREET }, { "krt", L_STREET | L_ABBR }, { "k\xc3\xb6r\xc3\xbat", L_STREET },
    { "rkp", L_STREET | L_ABBR }, { "k\xc3\xb6z", L_STREET }, { "fasor", L_STREET }, { "kapu", L_STREET },
    { "terrasse", L_STREET }, { "str", L_STREET | L_ABBR }, { "dei", L_PARTICLE }, { "degli", L_PARTICLE },
    { "delle", L_PARTICLE },
    /* units */
    { "apt", L_UNIT | L_ABBR }, { "apartment", L_UNIT }, { "suite", L_UNIT }, { "ste", L_UNIT | L_ABBR },
    { "unit", L_UNIT }, { "psc", L_UNIT }, { "flat", L_UNIT }, { "box", L_UNIT }, { "floor", L_UNIT }, { "fl", L_UNIT | L_ABBR },
    { "room", L_UNIT }, { "rm", L_UNIT | L_ABBR }, { "bldg", L_UNIT | L_ABBR },
    /* before an age */
    { "aged", L_AGECUE }, { "age", L_AGECUE }, { "turn", L_AGECUE }, { "turned", L_AGECUE },
    { "turning", L_AGECUE }, { "turns", L_AGECUE },
};
#undef FN
#undef HA
#define N_LEX (sizeof lexicon / sizeof lexicon[0])

/* The gazetteer: countries and major places, lowercase, written for this
 * file.  A capitalised (or ALL-CAPS) word from it is a location even alone
 * at a sentence start ("Estonia was fun"), where a lone capital is
 * otherwise taken for an ordinary word; in a run it makes the run a place
 * ("Southern Italy").  Multi-word names are listed by their distinctive
 * word (zealand, lanka, kong); the rest of the run joins by
 * capitalisation.  Left out on purpose: countries and cities that are
 * common first names (Jordan, Chad, Sofia, Florence, Victoria, Austin),
 * which the name rules find anyway. */
static const char *const countries[] = {
    "afghanistan", "albania", "algeria", "andorra", "angola", "argentina", "armenia", "australia", "austria",
    "azerbaijan", "bahamas", "bahrain", "bangladesh", "barbados", "belarus", "belgium", "belize", "benin", "bhutan",
    "bolivia", "bosnia", "herzegovina", "botswana", "brazil", "brasil", "brunei", "bulgaria", "burkina", "burundi",
    "cambodia", "cameroon", "canada", "chile", "colombia", "comoros", "congo", "croatia", "cuba", "cyprus",
    "czechia", "denmark", "djibouti", "dominica", "ecuador", "egypt", "eritrea", "estonia", "eswatini", "ethiopia",
    "fiji", "finland", "france", "gabon", "gambia", "germany", "deutschland", "ghana", "greece", "greenland",
    "grenada", "guatemala", "guyana", "haiti", "honduras", "hungary", "iceland", "india", "indonesia", "iran",
    "iraq", "ireland", "israel", "italy", "italia", "jamaica", "kazakhstan", "kenya", "kiribati", "kosovo",
    "kuwait", "kyrgyzstan", "laos", "latvia", "lebanon", "lesotho", "liberia", "libya", "liechtenstein",
    "lithuania", "luxembourg", "madagascar", "malawi", "malaysia", "maldives", "mali", "malta", "mauritania",
    "mauritius", "mexico", "micronesia", "moldova", "monaco", "mongolia", "montenegro", "morocco", "mozambique",
    "myanmar", "namibia", "nauru", "nepal", "netherlands", "holland", "nicaragua", "nigeria", "macedonia",
    "norway", "norge", "oman", "pakistan", "palau", "palestine", "panama", "paraguay", "peru", "philippines",
    "poland", "polska", "portugal", "qatar", "romania", "russia", "rwanda", "samoa", "senegal", "serbia",
    "seychelles", "singapore", "slovakia", "slovenia", "somalia", "espa\xc3\xb1" "a", "spain", "sudan", "suriname",
    "sweden", "sverige", "switzerland", "schweiz", "suisse", "syria", "taiwan", "tajikistan", "tanzania",
    "thailand", "tobago", "tunisia", "t\xc3\xbcrkiye", "turkmenistan", "tuvalu", "uganda", "ukraine", "uruguay",
    "uzbekistan", "vanuatu", "vatican", "venezuela", "vietnam", "yemen", "zambia", "zimbabwe", "england",
    "scotland", "wales", "britain", "america", "zealand", "korea", "emirates", "suomi", "danmark", "eesti",
    "magyarorsz\xc3\xa1g", "\xc3\xadsland", "\xc4\x8d" "esko", "slovensko", "hrvatska",
};
/* capitalised only: English words in lowercase, or a second word of a name */
static const char *const places[] = {
    "turkey", "georgia", "guinea", "china", "japan", "niger", "arabia", "lanka", "rica", "leone", "verde", "timor",
    "papua", "marino", "salvador", "uk", "usa", "uae",
    "london", "paris", "berlin", "madrid", "rome", "milan", "naples", "turin", "venice", "vienna", "prague",
    "budapest", "warsaw", "krakow", "krak\xc3\xb3w", "wroc\xc5\x82" "aw", "pozna\xc5\x84", "gdansk", "lisbon",
    "porto", "barcelona", "valencia", "seville", "bilbao", "amsterdam", "rotterdam", "utrecht", "brussels",
    "antwerp", "ghent", "bruges", "copenhagen", "k\xc3\xb8" "benhavn", "aarhus", "aalborg", "odense", "oslo",
    "bergen", "trondheim", "stavanger", "troms\xc3\xb8", "stockholm", "gothenburg", "g\xc3\xb6teborg",
    "malm\xc3\xb6", "uppsala", "helsinki", "espoo", "tampere", "turku", "oulu", "vantaa", "reykjavik",
    "reykjav\xc3\xadk", "akureyri", "dublin", "belfast", "edinburgh", "glasgow", "manchester", "liverpool",
    "birmingham", "leeds", "bristol", "cardiff", "zurich", "z\xc3\xbcrich", "geneva", "gen\xc3\xa8ve", "basel",
    "bern", "lausanne", "lucerne", "munich", "m\xc3\xbcnchen", "hamburg", "frankfurt", "cologne", "k\xc3\xb6ln",
    "stuttgart", "d\xc3\xbcsseldorf", "dresden", "leipzig", "hanover", "bremen", "nuremberg", "athens",
    "thessaloniki", "nicosia", "limassol", "larnaca", "paphos", "istanbul", "ankara", "izmir", "moscow",
    "petersburg", "kyiv", "kiev", "kharkiv", "odesa", "minsk", "riga", "tallinn", "tartu", "vilnius", "kaunas",
    "bucharest", "belgrade", "zagreb", "ljubljana", "bratislava", "sarajevo", "skopje", "tirana", "chisinau",
    "tbilisi", "yerevan", "baku", "cairo", "alexandria", "tunis", "algiers", "casablanca", "rabat", "marrakesh",
    "lagos", "abuja", "nairobi", "accra", "dakar", "kinshasa", "johannesburg", "pretoria", "durban", "toronto",
    "montreal", "vancouver", "ottawa", "calgary", "quebec", "winnipeg", "edmonton", "chicago", "boston",
    "houston", "dallas", "seattle", "miami", "atlanta", "denver", "phoenix", "philadelphia", "detroit",
    "brooklyn", "manhattan", "angeles", "francisco", "york", "orleans", "vegas", "portland", "guadalajara",
    "monterrey", "bogota", "bogot\xc3\xa1", "medell\xc3\xadn", "lima", "santiago", "quito", "caracas",
    "montevideo", "asunci\xc3\xb3n", "aires", "rio", "bras\xc3\xadlia", "fortaleza", "recife", "curitiba",
    "goi\xc3\xa2nia", "manaus", "tokyo", "osaka", "kyoto", "yokohama", "seoul", "busan", "beijing", "shanghai",
    "shenzhen", "guangzhou", "kong", "taipei", "bangkok", "hanoi", "manila", "jakarta", "lumpur", "delhi",
    "mumbai", "bangalore", "bengaluru", "chennai", "kolkata", "hyderabad", "karachi", "lahore", "islamabad",
    "dhaka", "kathmandu", "colombo", "tehran", "baghdad", "riyadh", "jeddah", "dubai", "doha", "dhabi",
    "jerusalem", "aviv", "beirut", "amman", "damascus", "sydney", "melbourne", "brisbane", "perth", "adelaide",
    "canberra", "auckland", "wellington", "christchurch",
};

/* compound street names: Hammarv\u00e4gen, Bahnhofstra\u00dfe (before a number) */
#define SUF(x) { x, sizeof x - 1 }
static const struct { const char *s; size_t n; } street_suffixes[] = {
    SUF("stra\xc3\x9f" "e"), SUF("strasse"), SUF("str"), SUF("gasse"), SUF("weg"), SUF("allee"), SUF("platz"),
    SUF("ring"), SUF("damm"), SUF("ufer"), SUF("v\xc3\xa4gen"), SUF("gatan"), SUF("gata"), SUF("v\xc3\xa4g"),
    SUF("gade"), SUF("vej"), SUF("veien"), SUF("vegen"), SUF("laan"), SUF("straat"), SUF("plein"), SUF("gracht"),
    SUF("kade"), SUF("utca"), SUF("katu"), SUF("tie"), SUF("tee"), SUF("iela"),
};
#undef SUF

/* ---- words ----------------------------------------------------------------- */

enum { S_LOWER, S_CAP, S_UPPER, S_NUM, S_ALNUM, S_OTHER }; /* a word's shape */
/* what lies between a word and the one before it */
enum {
    G_END = 1,    /* . ! ? (a sentence ends; not after an abbreviation) */
    G_COLON = 2,  /* : */
    G_COMMA = 4,  /* , ; */
    G_NL = 8,     /* one line break */
    G_PARA = 16,  /* a blank line, or the start of the message */
    G_OTHER = 32, /* quotes, brackets, dashes, ... */
    G_DOT = 64,   /* the gap starts with '.' */
    G_HASH = 128, /* # (before a unit number) */
};

typedef struct word {
    uint32_t s, e;
    uint32_t lex; /* L_* and K_* of its lowercase form */
    uint8_t shape, gap;
} word;

#define WINDOW 4096 /* words scanned at once */
#define LOOK 16     /* the most words any rule looks past its start */
#define MAX_RUN 8   /* the most words in one name run (a longer run is split) */

/* The lexicon as an open-addressing hash table (built once, read-only
 * after: detectors may be shared by threads), so a word costs one hash and
 * about one compare. */
#define SLOTS 2048 /* a power of two, over twice the lexicon and gazetteer */
typedef struct slot {
    const char *w;
    uint32_t len, f;
} slot;

/* The common-word list: every lowercase entry of the word file, an
 * open-addressing table of (offset, length) into the file's bytes. */
typedef struct wordlist {
    char *buf;
    struct wl_slot {
        uint32_t off, len; /* len 0: empty */
    } *tab;
    uint32_t mask;
} wordlist;

typedef struct names {
    slot tab[SLOTS];
    wordlist words;
} names;

static uint32_t fnv1a(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static void lex_insert(names *nm, const char *w, uint32_t f)
{
    size_t n = strlen(w);
    for (uint32_t h = fnv1a(w, n) & (SLOTS - 1);; h = (h + 1) & (SLOTS - 1)) {
        slot *sl = &nm->tab[h];
        if (!sl->w) {
            *sl = (slot){ w, (uint32_t)n, f };
            return;
        }
        if (sl->len == n && memcmp(sl->w, w, n) == 0) { /* a word listed twice: both roles */
            sl->f |= f;
            return;
        }
    }
}

#define LEX_MAX 24 /* longer words are in no list */

static uint32_t lookup(const names *nm, const char *s, size_t n)
{
    char key[LEX_MAX];
    if (n >= sizeof key) return 0;
    for (size_t i = 0; i < n; i++) key[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]);
    for (uint32_t h = fnv1a(key, n) & (SLOTS - 1);; h = (h + 1) & (SLOTS - 1)) {
        const slot *sl = &nm->tab[h];
        if (!sl->w) return 0;
        if (sl->len == n && memcmp(sl->w, key, n) == 0) return sl->f;
    }
}

#define WORDS_MAX ((size_t)64 << 20) /* wamerican is 1 MB; a list past this is not a word list */

static void words_insert(wordlist *wl, uint32_t off, uint32_t len)
{
    for (uint32_t h = fnv1a(wl->buf + off, len) & wl->mask;; h = (h + 1) & wl->mask) {
        struct wl_slot *sl = &wl->tab[h];
        if (!sl->len) {
            sl->off = off, sl->len = len;
            return;
        }
        if (sl->len == len && memcmp(wl->buf + sl->off, wl->buf + off, len) == 0) return;
    }
}

/* Reads the list at path: its lowercase-initial entries (the proper nouns
 * of wamerican are capitalised and stay out). */
static cp_status words_load(wordlist *wl, const char *path, cp_error *err)
{
    size_t len = 0;
    if (cp_read_file(path, WORDS_MAX, &wl->buf, &len, err) != CP_OK)
        return cp_fail_wrap(err, "names: the common-word list %s cannot be read (apt-get install wamerican, which .ci/deps "
                                 "installs; --words FILE for another list, --no-names to go without the recognizer)",
                            path);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += wl->buf[i] == '\n';
    uint32_t slots = 1024;
    while (slots < 2 * (n + 1)) slots <<= 1;
    wl->tab = cp_calloc(slots, sizeof *wl->tab, "names word table", err);
    if (!wl->tab) return CP_ENOMEM;
    wl->mask = slots - 1;
    size_t kept = 0;
    for (size_t i = 0; i < len;) {
        size_t e = i;
        while (e < len && wl->buf[e] != '\n' && wl->buf[e] != '\r') e++;
        if (e > i && e - i < LEX_MAX && wl->buf[i] >= 'a' && wl->buf[i] <= 'z') words_insert(wl, (uint32_t)i, (uint32_t)(e - i)), kept++;
        while (e < len && (wl->buf[e] == '\n' || wl->buf[e] == '\r')) e++;
        i = e;
    }
    if (kept < 1000) return cp_fail(err, CP_EINVAL, "names: %s holds %zu lowercase words: not a word list", path, kept);
    return CP_OK;
}

/* whether s[0..n) in lowercase (ASCII folded) is a common word */
static int common_word(const wordlist *wl, const char *s, size_t n)
{
    char key[LEX_MAX];
    if (n >= sizeof key || n == 0) return 0;
    for (size_t i = 0; i < n; i++) key[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]);
    for (uint32_t h = fnv1a(key, n) & wl->mask;; h = (h + 1) & wl->mask) {
        const struct wl_slot *sl = &wl->tab[h];
        if (!sl->len) return 0;
        if (sl->len == n && memcmp(wl->buf + sl->off, key, n) == 0) return 1;
    }
}

enum { C_SPACE, C_LOWER, C_UPPER, C_LETTER, C_DIGIT, C_MARK, C_PUNCT };

static int classify(uint32_t cp)
{
    if (cp < 128) {
        if (cp >= 'a' && cp <= 'z') return C_LOWER;
        if (cp >= 'A' && cp <= 'Z') return C_UPPER;
        if (cp >= '0' && cp <= '9') return C_DIGIT;
        if (cp == ' ' || cp == '\t' || cp == '\r' || cp == '\n' || cp == '\f' || cp == '\v') return C_SPACE;
        return C_PUNCT;
    }
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LT: return C_UPPER;
    case UTF8PROC_CATEGORY_LL: return C_LOWER;
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: return C_LETTER;
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME: return C_MARK;
    case UTF8PROC_CATEGORY_ND: return C_DIGIT;
    case UTF8PROC_CATEGORY_ZS: return C_SPACE;
    default: return C_PUNCT;
    }
}

/* the code point at t[i] (invalid bytes read as one punctuation byte) */
static int next_cp(const char *t, size_t len, size_t i, uint32_t *cp)
{
    int l = cp_utf8_len((const unsigned char *)t + i, len - i, cp);
    if (l == 0) {
        *cp = 0xfffd;
        l = 1;
    }
    return l;
}

static int is_initial_letter(const char *t, const word *w) { return w->shape == S_CAP && w->e - w->s == 1 && t[w->s] >= 'A'; }

static int compound_street(const char *w, size_t n)
{
    for (size_t i = 0; i < sizeof street_suffixes / sizeof street_suffixes[0]; i++) {
        size_t l = street_suffixes[i].n;
        if (n >= l + 3 && w[n - 1] == street_suffixes[i].s[l - 1] && memcmp(w + n - l, street_suffixes[i].s, l) == 0) return 1;
    }
    return 0;
}

/* Fills w with up to cap words of t from byte pos; *stop is where the scan
 * stopped (len, or the end of the last word when the window is full). */
static size_t tokenize(const names *nm, const char *t, size_t len, size_t pos, word *w, size_t cap, size_t *stop,
                       uint64_t *steps)
{
    size_t n = 0, i = pos;
    unsigned gap = pos == 0 ? G_PARA : 0, nl = 0, ends = 0;
    while (i < len && n < cap) {
        uint32_t cp;
        int l = next_cp(t, len, i, &cp), c = classify(cp);
        if (c == C_SPACE || c == C_PUNCT || c == C_MARK) {
            if (cp == '\n') nl++;
            else if (cp == '.' || cp == '!' || cp == '?' || cp == 0x2026) {
                if (cp == '.' && i > 0 && n > 0 && i == w[n - 1].e) gap |= G_DOT;
                ends++;
            } else if (cp == ':') gap |= G_COLON;
            else if (cp == ',' || cp == ';') gap |= G_COMMA;
            else if (cp == '>' && (nl > 0 || (gap & G_PARA))) {
            } /* a quote marker at a line start (> Suite 318): the lines still join */
            else if (cp == '#') gap |= G_HASH;
            else if (c != C_SPACE) gap |= G_OTHER;
            i += (size_t)l;
            continue;
        }
        /* a word: letters, digits and marks, with inner ' ’ - before a letter or digit */
        word *x = &w[n];
        x->s = (uint32_t)i;
        int first = c, lower = 0, letters = 0, digits = 0;
        for (;;) {
            lower += c == C_LOWER, letters += c == C_LOWER || c == C_UPPER || c == C_LETTER;
            digits += c == C_DIGIT;
            i += (size_t)l;
            if (i >= len) break;
            l = next_cp(t, len, i, &cp);
            c = classify(cp);
            if (c != C_SPACE && c != C_PUNCT) continue;
            if (cp != '\'' && cp != 0x2019 && cp != '-') break;
            uint32_t cp2;
            if (i + (size_t)l >= len) break;
            int l2 = next_cp(t, len, i + (size_t)l, &cp2), c2 = classify(cp2);
            if (c2 == C_LOWER || c2 == C_UPPER || c2 == C_LETTER || (cp == '-' && c2 == C_DIGIT)) {
                i += (size_t)l; /* the connector; the loop adds the letter */
                l = l2, c = c2;
                continue;
            }
            break;
        }
        x->e = (uint32_t)i;
        if (letters == 0) x->shape = S_NUM;
        else if (digits > 0) x->shape = S_ALNUM;
        else if (first == C_UPPER) x->shape = letters >= 2 && lower == 0 ? S_UPPER : S_CAP;
        else if (first == C_LOWER) x->shape = S_LOWER;
        else x->shape = S_OTHER;
        x->lex = letters && !digits ? lookup(nm, t + x->s, x->e - x->s) : 0;
        if (x->shape == S_CAP && compound_street(t + x->s, x->e - x->s)) x->lex |= L_COMPOUND;
        /* a single '.' after an abbreviation or an initial does not end the sentence */
        if (ends == 1 && (gap & G_DOT) && (w[n - 1].lex & L_ABBR || is_initial_letter(t, &w[n - 1]))) ends = 0;
        x->gap = (uint8_t)(gap | (ends ? G_END : 0) | (nl >= 2 ? G_PARA : nl == 1 ? G_NL : 0));
        gap = nl = ends = 0;
        n++;
    }
    *stop = n == cap ? w[n - 1].e : len;
    *steps += i - pos; /* bytes read */
    return n;
}

/* ---- rules ----------------------------------------------------------------- */

typedef struct scan {
    const char *t;
    size_t len;
    word *w;
    size_t n, lim; /* words in the window; matches start before lim */
    uint8_t *used; /* per word: already in a span */
    cp_spans *out;
    uint64_t *steps; /* words visited, for out->steps: linear in the message */
    const wordlist *words;
} scan;

#define STEP(s) (++*(s)->steps)

static int sentence_start(const scan *s, size_t i) { return (s->w[i].gap & (G_END | G_COLON | G_PARA)) != 0; }

/* word k continues a name begun before it: only spaces (or one line break)
 * between, or the '.' of an initial / abbreviation */
static int joined(const scan *s, size_t k) { return (s->w[k].gap & (G_END | G_COLON | G_COMMA | G_PARA | G_OTHER | G_HASH)) == 0; }

/* a word that can be part of a name run */
static int namey(const scan *s, size_t k) { return s->w[k].shape == S_CAP && !(s->w[k].lex & L_STOP) && !s->used[k]; }

/* the last word of the capitalised run starting at i (particles inside) */
static size_t run_end(const scan *s, size_t i)
{
    size_t j = i;
    /* bounded: "Dr. Dr. Dr. ..." is one run as long as the message, and
     * every cue and word before it would walk it again (quadratic) */
    while (j + 1 < s->n && j + 1 < i + MAX_RUN) {
        STEP(s);
        size_t k = j + 1;
        size_t p = k; /* up to two particles: van der, de la */
        while (p < s->n && p < k + 2 && joined(s, p) && s->w[p].shape == S_LOWER && (s->w[p].lex & L_PARTICLE)) p++;
        if (joined(s, k) && namey(s, k)) j = k;
        else if (p > k && p < s->n && joined(s, p) && namey(s, p)) j = p;
        else if (joined(s, k) && s->w[k].shape == S_UPPER && (s->w[k].lex & L_ORG)) j = k; /* Acme AG */
        else if (p > k && p < s->n && joined(s, p) && s->w[p].shape == S_UPPER && !s->used[p] && (s->w[j].lex & L_ORG))
            j = p; /* University of PORVOO */
        else break;
    }
    return j;
}

/* the span's end byte: past the '.' of a final abbreviation (Inc., St.) */
static uint32_t end_of(const scan *s, size_t j)
{
    uint32_t e = s->w[j].e;
    if ((s->w[j].lex & L_ABBR) && e < s->len && s->t[e] == '.') e++;
    return e;
}

static cp_status emit(scan *s, size_t i, size_t j, const char *type, float score, cp_error *err)
{
    for (size_t k = i; k <= j; k++) STEP(s), s->used[k] = 1;
    return cp_spans_add(s->out, s->w[i].s, end_of(s, j), type, score, err);
}

static int number_value(const scan *s, size_t k, int max)
{
    const word *w = &s->w[k];
    if (w->shape != S_NUM || w->e - w->s > 3) return -1;
    int v = 0;
    for (uint32_t i = w->s; i < w->e; i++) v = v * 10 + (s->t[i] - '0');
    return v <= max ? v : -1;
}

/* a capitalised word ending in a compound street type (Lindenstra\u00dfe):
 * found once per word by tokenize (the address rules ask up to 7 times) */
static int street_compound(const scan *s, size_t k) { return (s->w[k].lex & L_COMPOUND) != 0; }

static int num_like(const scan *s, size_t k) { return s->w[k].shape == S_NUM || (s->w[k].shape == S_ALNUM && s->t[s->w[k].s] >= '0' && s->t[s->w[k].s] <= '9'); }

/* address parts may be separated by commas and line breaks, not by a
 * sentence end, a blank line or other punctuation */
static int addr_joined(const scan *s, size_t k) { return (s->w[k].gap & (G_END | G_PARA | G_OTHER | G_COLON)) == 0; }

/* the end of the address core starting at word i, or 0 if none starts there */
static size_t address_core(const scan *s, size_t i)
{
    const word *w = s->w;
    size_t lim = i + 7 < s->n ? i + 7 : s->n;
    int capish = w[i].shape == S_CAP || w[i].shape == S_UPPER;
    /* 221 Baker Street, 10 Downing St: a number, names, a street type */
    if (num_like(s, i)) {
        for (size_t j = i + 1; j < lim && joined(s, j); j++) {
            STEP(s);
            int cap = w[j].shape == S_CAP || w[j].shape == S_UPPER;
            if (j > i + 1 && cap && (w[j].lex & L_STREET)) return j;
            /* 6076 Piroska u. 97, 210 Fourth avenue: a street type in lowercase after a capitalised name */
            if (j > i + 1 && w[j].shape == S_LOWER && (w[j].lex & L_STREET) && (w[j - 1].shape == S_CAP || w[j - 1].shape == S_UPPER))
                return j + 1 < s->n && joined(s, j + 1) && num_like(s, j + 1) ? j + 1 : j;
            /* 2274 Via delle Coste 41, 5049 Harjukuja 54: house number, street, number */
            if (j > i + 1 && num_like(s, j) && (w[j - 1].shape == S_CAP || w[j - 1].shape == S_UPPER)) return j;
            if (!cap && !num_like(s, j) && !(w[j].shape == S_LOWER && (w[j].lex & L_PARTICLE))) break;
        }
        return 0;
    }
    /* Via Roma 12, Rue de la Paix 5, ul. Kwiatowa 5: a street type, names, a number */
    if ((w[i].lex & L_STREETPRE) && (capish || (w[i].shape == S_LOWER && (w[i].lex & L_ABBR)))) {
        for (size_t j = i + 1; j < lim && joined(s, j); j++) {
            STEP(s);
            if (num_like(s, j)) return j > i + 1 ? j : 0;
            if (w[j].shape != S_CAP && w[j].shape != S_UPPER && !(w[j].shape == S_LOWER && (w[j].lex & L_PARTICLE))) break;
        }
    }
    /* Villacher Strasse 89, R\u00e1k\u00f3czi \u00fat 66, Hammarv\u00e4gen 15: names ending in a street type, a number */
    if (w[i].shape == S_CAP && !(w[i].lex & (L_FUNC | L_STOP))) {
        for (size_t j = i; j + 1 < lim && (j == i || joined(s, j)); j++) {
            STEP(s);
            int typed = street_compound(s, j) || (j > i && (w[j].lex & L_STREET));
            if (typed && joined(s, j + 1) && num_like(s, j + 1)) return j + 1;
            if (j > i && w[j].shape != S_CAP && !(w[j].lex & L_STREET) && !(w[j].lex & L_PARTICLE)) break;
        }
    }
    /* USNS Brown, USCGC Khadzhiyev (the FPO line follows) */
    if ((w[i].lex & L_SHIP) && w[i].shape == S_UPPER && i + 1 < s->n && joined(s, i + 1) && w[i + 1].shape == S_CAP) return i + 1;
    /* Apt 4B, Apt. 22, Suite 300, Box 12, unit #5 */
    if ((w[i].lex & L_UNIT) && (capish || w[i].shape == S_LOWER) && i + 1 < s->n &&
        (joined(s, i + 1) || (w[i + 1].gap & ~(G_HASH | G_DOT)) == 0) && (num_like(s, i + 1) || w[i + 1].shape == S_ALNUM))
        return i + 1;
    return 0;
}

/* ---- dates ----------------------------------------------------------------- */

/* the value of the digits t[a..e), or -1 if not all digits or not n_lo..n_hi of them */
static int digits_value(const char *t, uint32_t a, uint32_t e, unsigned n_lo, unsigned n_hi)
{
    if (e - a < n_lo || e - a > n_hi) return -1;
    int v = 0;
    for (uint32_t i = a; i < e; i++) {
        if (t[i] < '0' || t[i] > '9') return -1;
        v = v * 10 + (t[i] - '0');
    }
    return v;
}

/* y-m-d or d-m-y (either order of day and month) in three digit groups: a real calendar shape */
static int date_parts(int a, int b, int c, int year_first)
{
    int y = year_first ? a : c, p = year_first ? b : a, q = year_first ? c : b;
    return y >= 1900 && y <= 2099 && p >= 1 && q >= 1 && ((p <= 12 && q <= 31) || (p <= 31 && q <= 12));
}

/* a full date at word i: 2000-04-16 (one word: hyphens join digits), or
 * 2/16/1942, 16.04.2000 (three words and the same '/' or '.' between);
 * the index of its last word, or -1 */
static long date_at(const scan *s, size_t i)
{
    const word *w = s->w;
    const char *t = s->t;
    if (w[i].shape != S_NUM) return -1;
    uint32_t a = w[i].s, e = w[i].e, h1 = a, h2;
    while (h1 < e && t[h1] != '-') h1++;
    if (h1 < e) { /* one word with two hyphens */
        for (h2 = h1 + 1; h2 < e && t[h2] != '-'; h2++) {}
        if (h2 >= e || memchr(t + h2 + 1, '-', e - h2 - 1)) return -1;
        int x = digits_value(t, a, h1, 1, 4), y = digits_value(t, h1 + 1, h2, 1, 2), z = digits_value(t, h2 + 1, e, 1, 4);
        if (x < 0 || y < 0 || z < 0) return -1;
        return date_parts(x, y, z, h1 - a == 4) ? (long)i : -1;
    }
    if (i + 2 >= s->n) return -1;
    char sep = t[e];
    if ((sep != '/' && sep != '.') || w[i + 1].s != e + 1 || w[i + 1].shape != S_NUM || t[w[i + 1].e] != sep ||
        w[i + 2].s != w[i + 1].e + 1 || w[i + 2].shape != S_NUM)
        return -1;
    int x = digits_value(t, a, e, 1, 4), y = digits_value(t, w[i + 1].s, w[i + 1].e, 1, 2), z = digits_value(t, w[i + 2].s, w[i + 2].e, 1, 4);
    if (x < 0 || y < 0 || z < 0 || !date_parts(x, y, z, e - a == 4)) return -1;
    return (long)i + 2;
}

/* ... and a time after it: 11:34 or 11:34:35 (the words and the colons, no spaces between) */
static size_t time_after(const scan *s, size_t j)
{
    const word *w = s->w;
    size_t k = j + 1;
    if (k >= s->n || w[k].shape != S_NUM || (w[k].gap & ~(G_COMMA | G_NL)) || digits_value(s->t, w[k].s, w[k].e, 1, 2) < 0) return j;
    size_t end = j;
    for (size_t m = k; m + 1 < s->n && m < k + 2; m++) {
        STEP(s);
        if (s->t[w[m].e] != ':' || w[m + 1].s != w[m].e + 1 || digits_value(s->t, w[m + 1].s, w[m + 1].e, 2, 2) < 0) break;
        end = m + 1;
    }
    return end;
}

/* Full dates (with their time): in a user's turn a date is most often
 * theirs -- a birthday, an appointment, a timestamp.  Years alone and
 * weekdays are left alone. */
static cp_status pass_dates(scan *s, cp_error *err)
{
    for (size_t i = 0; i < s->lim; i++) {
        STEP(s);
        long j = s->used[i] ? -1 : date_at(s, i);
        if (j < 0) continue;
        size_t e = time_after(s, (size_t)j);
        cp_status rc = emit(s, i, e, "date", 0.6f, err);
        if (rc) return rc;
        i = e;
    }
    return CP_OK;
}

/* lives on Grössgstötten 50, at Nieuwe Baan 473 St.: after an address cue,
 * up to three capitalised words and a number (no street type) */
static size_t address_after_cue(const scan *s, size_t i)
{
    const word *w = s->w;
    if (i == 0 || !joined(s, i) || w[i - 1].shape != S_LOWER || !(w[i - 1].lex & L_ADDRCUE) || w[i].shape != S_CAP ||
        (w[i].lex & (L_FUNC | L_STOP | L_ROLE | L_HONOR)))
        return 0;
    for (size_t j = i + 1; j < s->n && j <= i + 3 && joined(s, j); j++) {
        STEP(s);
        if (num_like(s, j)) return j + 1 < s->n && joined(s, j + 1) && (w[j + 1].lex & L_STREET) ? j + 1 : j;
        if (w[j].shape != S_CAP && !(w[j].shape == S_LOWER && (w[j].lex & L_PARTICLE))) break;
    }
    return 0;
}

/* an address line goes on after a blank line when that line is its country (Estonia 62488) */
static int addr_next_line(const scan *s, size_t k)
{
    return addr_joined(s, k) || ((s->w[k].gap & G_PARA) && !(s->w[k].gap & (G_END | G_OTHER | G_COLON)) && (s->w[k].lex & L_GAZ));
}

static cp_status pass_addresses(scan *s, cp_error *err)
{
    const word *w = s->w;
    for (size_t i = 0; i < s->lim; i++) {
        STEP(s);
        if (s->used[i]) continue;
        size_t j = address_core(s, i);
        if (!j) j = address_after_cue(s, i);
        if (!j) continue;
        size_t a = i;
        while (a > 0 && i - a < 2 && !s->used[a - 1] && joined(s, a) && num_like(s, a - 1)) a--; /* 230 107 Igias St */
        if (w[i].lex & L_UNIT) /* P.O. Box 12 */
            while (a > 0 && i - a < 2 && !s->used[a - 1] && joined(s, a) && is_initial_letter(s->t, &w[a - 1])) a--;
        /* then units, a locality, a region code and a postcode */
        for (size_t k = j + 1, steps = 0; k < s->n && steps < 10 && addr_next_line(s, k); k++, steps++) {
            STEP(s);
            int ok = num_like(s, k) || (w[k].shape == S_ALNUM) || w[k].shape == S_UPPER ||
                     (w[k].shape == S_CAP && !(w[k].lex & (L_STOP | L_FUNC))) || (w[k].lex & L_UNIT) ||
                     (w[k].shape == S_LOWER && (w[k].lex & L_PARTICLE) && k + 1 < s->n && w[k + 1].shape == S_CAP);
            if (!ok) break;
            j = k;
        }
        cp_status rc = emit(s, a, j, "address", 0.7f, err);
        if (rc) return rc;
        i = j;
    }
    return CP_OK;
}

/* the word before i has flag f and only spaces lie between them */
static int prev_is(const scan *s, size_t i, uint32_t f)
{
    return i > 0 && !(s->w[i].gap & (G_END | G_PARA | G_OTHER | G_COMMA)) && (s->w[i - 1].lex & f);
}

/* Project Manager, Grad C, Sir, B: roles, titles alone and initials alone name no one */
static int only_roles(const scan *s, size_t i, size_t j)
{
    for (size_t k = i; k <= j; k++)
        if (STEP(s), !(s->w[k].lex & (L_ROLE | L_HONOR)) && !is_initial_letter(s->t, &s->w[k])) return 0;
    return 1;
}

static cp_status person_after(scan *s, size_t k, float score, cp_error *err)
{
    size_t j = run_end(s, k);
    /* a trailing org word makes it an organisation (Dr Who Ltd is rare; Acme Ltd is not) */
    return emit(s, k, j, (s->w[j].lex & L_ORG) ? "org" : "person", score, err);
}

static cp_status pass_cues(scan *s, cp_error *err)
{
    const word *w = s->w;
    const char *t = s->t;
    for (size_t i = 0; i < s->lim; i++) {
        STEP(s);
        if (s->used[i] || i + 1 >= s->n) continue;
        size_t k = i + 1;
        cp_status rc = CP_OK;
        int cap_next = joined(s, k) && (w[k].shape == S_CAP || w[k].shape == S_UPPER) && !s->used[k];
        int plain_next = cap_next && !(w[k].lex & (L_FUNC | L_STOP));
        /* Mr Smith, Dr. Ada Obi (mr. in lowercase too) */
        /* (not Professor B: a speaker label's initial names no one) */
        if ((w[i].lex & L_HONOR) && cap_next && !only_roles(s, k, run_end(s, k)) &&
            (w[i].shape == S_CAP || (w[i].shape == S_LOWER && (w[i].lex & L_ABBR) && (w[k].gap & G_DOT)))) {
            if ((rc = emit(s, i, i, "title", 0.8f, err)) || (rc = person_after(s, k, 0.8f, err))) return rc;
            continue;
        }
        /* my name is X, call me X, name: X -- lowercase names too */
        uint32_t f = w[i].lex;
        int strong = ((f & K_IS) && prev_is(s, i, K_NAME)) || ((f & K_ME) && prev_is(s, i, K_CALL)) ||
                     ((f & K_NAME) && (w[k].gap & G_COLON) && !(w[k].gap & (G_END | G_PARA)));
        int weak = ((f & K_AM) && prev_is(s, i, K_I)) || (f & (K_IM | K_NAMED));
        int cue_gap = joined(s, k) || (strong && !(w[k].gap & (G_END | G_PARA | G_OTHER)));
        if ((strong && cue_gap && (w[k].shape == S_CAP || w[k].shape == S_UPPER) && !s->used[k]) || (weak && plain_next)) {
            if ((rc = person_after(s, k, 0.8f, err))) return rc;
            continue;
        }
        if (strong && cue_gap && w[k].shape == S_LOWER && !(w[k].lex & L_FUNC)) {
            size_t j = k;
            while (j + 1 < s->n && j < k + 2 && joined(s, j + 1) && w[j + 1].shape == S_LOWER && !(w[j + 1].lex & L_FUNC))
                j++, STEP(s);
            if ((rc = emit(s, k, j, "person", 0.7f, err))) return rc;
            continue;
        }
        /* I am 34, I'm 34, aged 34, turned 21 */
        int age_cue = weak || (w[i].lex & L_AGECUE);
        if (age_cue && !(f & K_NAMED) && (joined(s, k) || (w[k].gap & ~(G_COLON)) == 0) &&
            number_value(s, k, 130) >= 0) {
            /* "I am 5 minutes late" is no age: a measure word after the number */
            int unit_after = k + 1 < s->n && joined(s, k + 1) && w[k + 1].shape == S_LOWER && !(w[k + 1].lex & L_FUNC) &&
                             !(w[k + 1].lex & K_YEARS);
            if (!unit_after && (rc = emit(s, k, k, "age", 0.7f, err))) return rc;
            continue;
        }
        /* in OSLO, from ΠΑΦΟΣ: a place written in capitals after a place cue */
        /* (to and on too, not of: the University of TARTU is one name) */
        int place_cue = (w[i].lex & L_LOCCUE) || ((w[i].lex & L_ADDRCUE) && !(w[i].lex & L_PARTICLE));
        if (w[i].shape == S_LOWER && place_cue && joined(s, k) && w[k].shape == S_UPPER && !s->used[k] &&
            !(w[k].lex & (L_STOP | L_FUNC | L_ROLE | L_ORG))) {
            size_t j = k;
            while (j + 1 < s->n && j < k + 3 && joined(s, j + 1) && w[j + 1].shape == S_UPPER && !s->used[j + 1]) j++, STEP(s);
            if ((rc = emit(s, k, j, "location", 0.6f, err))) return rc;
            continue;
        }
        /* 34 years old, 34-year-old */
        if (number_value(s, i, 130) >= 0 && i + 2 < s->n && (w[k].lex & K_YEARS) && joined(s, k) && (w[k + 1].lex & K_OLD) &&
            joined(s, k + 1)) {
            if ((rc = emit(s, i, i, "age", 0.7f, err))) return rc;
            continue;
        }
        if (w[i].shape == S_ALNUM && !s->used[i]) {
            uint32_t d = w[i].s;
            while (d < w[i].e && t[d] >= '0' && t[d] <= '9') d++;
            static const char yo[] = "-year-old", yso[] = "-years-old";
            size_t rest = w[i].e - d;
            if (d > w[i].s && d - w[i].s <= 3 &&
                ((rest == sizeof yo - 1 && memcmp(t + d, yo, rest) == 0) || (rest == sizeof yso - 1 && memcmp(t + d, yso, rest) == 0))) {
                s->used[i] = 1;
                if ((rc = cp_spans_add(s->out, w[i].s, d, "age", 0.7f, err))) return rc;
            }
        }
    }
    return CP_OK;
}

/* what a run of capitalised words i..j is */
static const char *run_type(const scan *s, size_t i, size_t j)
{
    for (size_t k = i; k <= j; k++)
        if (STEP(s), s->w[k].lex & L_ORG) return "org";
    int place = (s->w[j].lex & L_STREET) != 0; /* Quarry Lane, without its number */
    for (size_t k = i; k <= j; k++) STEP(s), place |= (s->w[k].lex & (L_PLACE | L_GAZ)) != 0;
    if (i > 0 && joined(s, i) && s->w[i - 1].shape == S_LOWER && (s->w[i - 1].lex & L_LOCCUE)) place = 1;
    return place ? "location" : "person";
}

/* Word k is a common English word: listed as it is, or (Well-known, Don't,
 * Anna’s) its parts are -- all the parts of a hyphenated word, the part
 * before an apostrophe followed by a short suffix. */
static int word_is_common(const scan *s, size_t k)
{
    const char *t = s->t;
    uint32_t a = s->w[k].s, e = s->w[k].e;
    if (common_word(s->words, t + a, e - a)) return 1;
    for (uint32_t b = a; b < e; b++) {
        int apos = t[b] == '\'' ? 1 : (e - b >= 3 && (unsigned char)t[b] == 0xe2 && (unsigned char)t[b + 1] == 0x80 &&
                                         (unsigned char)t[b + 2] == 0x99) ? 3 : 0;
        if (apos) return e - (b + (uint32_t)apos) <= 2 && common_word(s->words, t + a, b - a);
        if (t[b] != '-') continue;
        if (!common_word(s->words, t + a, b - a)) return 0;
        a = b + 1;
        if (memchr(t + a, '-', e - a) == NULL) return common_word(s->words, t + a, e - a);
    }
    return 0;
}

static int lone_name(const scan *s, size_t a)
{
    const word *w = s->w;
    if (w[a].lex & (L_ROLE | L_HONOR | L_PLACE | L_ORG | L_STREET | L_UNIT) || is_initial_letter(s->t, &w[a])) return 0;
    /* Usamov, Järvilehto, Opencounter: no English word (an English word that
     * is also a name -- Will, Rose -- stays shareable at a sentence start) */
    if (!w[a].lex && !word_is_common(s, a)) return 1;
    if (a + 1 >= s->n) return (w[a].gap & (G_END | G_PARA)) != 0; /* the message's last sentence */
    uint8_t g = w[a + 1].gap;
    if ((g & G_COLON) && !(g & (G_END | G_OTHER | G_COMMA)) && (w[a].gap & (G_NL | G_PARA))) return 1;
    if ((g & G_END) && !(g & G_DOT && w[a].lex)) return 1;
    /* Ramsey-Johnson: both halves capitalised */
    for (uint32_t b = w[a].s + 1; b + 1 < w[a].e; b++)
        if (s->t[b] == '-' && s->t[b + 1] >= 'A' && s->t[b + 1] <= 'Z') return 1;
    /* Usamov and Bowers were ...: a pair of names */
    if (!w[a].lex && a + 2 < s->n && joined(s, a + 1) && w[a + 1].shape == S_LOWER && (w[a + 1].lex & K_AND) &&
        joined(s, a + 2) && namey(s, a + 2) && !(w[a + 2].lex & (L_FUNC | L_ROLE)))
        return 1;
    return joined(s, a + 1) && (w[a + 1].lex & K_SAYS);
}

/* Clark, Romero and Hall: three capitalised names, a comma, "and" -- a firm's name
 * (or three people): the end word, or 0 */
static size_t firm_of_names(const scan *s, size_t i)
{
    const word *w = s->w;
    if (i + 3 >= s->n || w[i].shape != S_CAP || (w[i].lex & (L_FUNC | L_STOP))) return 0;
    if (!(w[i + 1].gap & G_COMMA) || (w[i + 1].gap & (G_END | G_PARA | G_OTHER | G_COLON)) || !namey(s, i + 1)) return 0;
    if (!joined(s, i + 2) || !(w[i + 2].lex & K_AND) || w[i + 2].shape != S_LOWER) return 0;
    return joined(s, i + 3) && namey(s, i + 3) && !(w[i + 3].lex & L_FUNC) ? i + 3 : 0;
}

/* a CITY line right above a country line (SEINÄJOKI / Finland 38524) */
static size_t city_line(const scan *s, size_t i)
{
    const word *w = s->w;
    if (w[i].shape != S_UPPER || !(w[i].gap & (G_NL | G_PARA)) || s->used[i] || (w[i].lex & (L_STOP | L_ORG | L_UNIT)))
        return 0;
    size_t j = i;
    while (j + 1 < s->n && j < i + 3 && joined(s, j + 1) && !(w[j + 1].gap & G_NL) && w[j + 1].shape == S_UPPER) j++;
    return j + 1 < s->n && (w[j + 1].gap & (G_NL | G_PARA)) && (w[j + 1].lex & L_GAZ) ? j : 0;
}

/* stillwater supercomputing inc.: lowercase words before a legal suffix */
static size_t lower_firm_start(const scan *s, size_t k)
{
    const word *w = s->w;
    size_t a = k;
    while (a > 0 && k - a < 3 && joined(s, a) && w[a - 1].shape == S_LOWER && !(w[a - 1].lex & (L_FUNC | L_ADDRCUE)) && !s->used[a - 1])
        a--;
    return a;
}

static cp_status pass_runs(scan *s, cp_error *err)
{
    for (size_t i = 0; i < s->lim; i++) {
        STEP(s);
        size_t f;
        if (!s->used[i] && (f = firm_of_names(s, i))) {
            cp_status rc = emit(s, i, f, "org", 0.6f, err);
            if (rc) return rc;
            i = f;
            continue;
        }
        if ((f = city_line(s, i))) {
            cp_status rc = emit(s, i, f, "location", 0.6f, err);
            if (rc) return rc;
            i = f;
            continue;
        }
        if (!s->used[i] && s->w[i].shape == S_LOWER && (s->w[i].lex & L_LEGAL) && (f = lower_firm_start(s, i)) < i) {
            cp_status rc = emit(s, f, i, "org", 0.6f, err);
            if (rc) return rc;
            continue;
        }
        /* a place from the gazetteer in capitals (TRONDHEIM), or a country in lowercase (from tunisia) */
        if (!s->used[i] && (((s->w[i].lex & L_GAZ) && s->w[i].shape == S_UPPER) || ((s->w[i].lex & L_GAZLC) && s->w[i].shape == S_LOWER))) {
            cp_status rc = emit(s, i, i, "location", 0.6f, err);
            if (rc) return rc;
            continue;
        }
        if (s->w[i].shape != S_CAP || s->used[i]) continue;
        int initial = sentence_start(s, i);
        /* sentence-start and function words are not names: The, Please, Hello, May */
        size_t a = i;
        while (a < s->n && s->w[a].shape == S_CAP && !s->used[a] && (s->w[a].lex & (L_FUNC | L_STOP)) && (a == i || joined(s, a)))
            a++, STEP(s);
        if (a > i) {
            if (a >= s->n || !joined(s, a) || !namey(s, a)) {
                i = a - 1;
                continue;
            }
            initial = 0; /* "Hello Anna": Anna is not where the sentence starts */
        }
        size_t j = run_end(s, a);
        /* one capitalised word at a sentence start is most often an ordinary
         * word -- unless it is a speaker label at a line start (Amara: ...),
         * a sentence of its own (What is your surname? Okafor.) or the
         * subject of a verb of people (Amara replied) */
        if (initial && j == a && !lone_name(s, a) && !(s->w[a].lex & L_GAZ)) continue;
        if (only_roles(s, a, j)) {
            i = j;
            continue;
        }
        const char *type = run_type(s, a, j);
        /* 48 Factoring Inc: a number opening a firm's name */
        if (type[0] == 'o' && a > 0 && !s->used[a - 1] && joined(s, a) && s->w[a - 1].shape == S_NUM) a--;
        cp_status rc = emit(s, a, j, type, 0.6f, err);
        if (rc) return rc;
        i = j;
    }
    return CP_OK;
}

/* ---- the detector ---------------------------------------------------------- */

typedef struct scratch {
    word w[WINDOW];
    uint8_t used[WINDOW];
} scratch;

/* where the next window starts: after a sentence that ends with a lowercase
 * word, so no rule needs words on both sides of the cut */
static size_t cut_at(const word *w, size_t n)
{
    for (size_t k = n - LOOK; k > n / 2; k--)
        if ((w[k].gap & (G_END | G_PARA)) && w[k - 1].shape == S_LOWER) return k;
    return n - LOOK;
}

static cp_status names_detect(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err)
{
    (void)role; /* the chain's policy chooses the roles */
    const names *nm = d->impl;
    if (len > UINT32_MAX) return cp_fail(err, CP_ERANGE, "names: message of %zu bytes is over 4 GiB", len);
    /* per call, not in the detector: the chain may be shared by threads */
    scratch *sc = cp_malloc(sizeof *sc, "names scratch", err);
    if (!sc) return CP_ENOMEM;
    cp_status rc = CP_OK;
    size_t pos = 0;
    while (pos < len && rc == CP_OK) {
        size_t stop;
        size_t n = tokenize(nm, text, len, pos, sc->w, WINDOW, &stop, &out->steps);
        if (n == 0) break;
        size_t lim = stop < len ? cut_at(sc->w, n) : n;
        memset(sc->used, 0, n);
        scan s = { text, len, sc->w, n, lim, sc->used, out, &out->steps, &nm->words };
        if ((rc = pass_dates(&s, err)) || (rc = pass_addresses(&s, err)) || (rc = pass_cues(&s, err)) || (rc = pass_runs(&s, err))) break;
        if (stop >= len) break;
        pos = sc->w[lim - 1].e;
    }
    free(sc);
    return rc;
}

static void names_free(names *nm)
{
    if (!nm) return;
    free(nm->words.buf);
    free(nm->words.tab);
    free(nm);
}

static void names_destroy(cp_detector *d)
{
    names_free(d->impl);
    free(d);
}

cp_status cp_detector_names(cp_detector **out, cp_error *err) { return cp_detector_names_words(NULL, out, err); }

cp_status cp_detector_names_words(const char *words, cp_detector **out, cp_error *err)
{
    *out = NULL;
    cp_detector *d = cp_calloc(1, sizeof *d, "detector", err);
    names *nm = d ? cp_calloc(1, sizeof *nm, "names lexicon", err) : NULL;
    if (!nm) {
        free(d);
        return CP_ENOMEM;
    }
    cp_status rc = words_load(&nm->words, words ? words : CP_WORDS_DEFAULT, err);
    if (rc) {
        names_free(nm);
        free(d);
        return rc;
    }
    for (size_t i = 0; i < N_LEX; i++) lex_insert(nm, lexicon[i].w, lexicon[i].f);
    for (size_t i = 0; i < sizeof countries / sizeof countries[0]; i++) lex_insert(nm, countries[i], L_GAZ | L_GAZLC);
    for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) lex_insert(nm, places[i], L_GAZ);
    d->name = "names";
    d->detect = names_detect;
    d->destroy = names_destroy;
    d->impl = nm;
    *out = d;
    return CP_OK;
}
