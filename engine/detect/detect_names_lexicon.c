/* The free-text recognizer's word lists, written for it: the lexicon
 * (words that are never names, cues, honorifics, particles, organisation,
 * place and street words), the gazetteer (countries and major places) and
 * the compound street suffixes; the open-addressing table they are looked
 * up in; and the common-word list read at run time (wamerican).  The rules
 * that use them are in detect_names.c and its siblings. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/fileio.h"
#include "detect_names_internal.h"

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
    /* sentence-start pronouns, articles, greetings and auxiliaries of other
     * languages (Ich wohne ..., Je suis ..., Меня зовут ...): a capitalised
     * one at a sentence start is taken for a name otherwise.  Left out: those
     * that are names or name particles too (Mia, Ella, Ben, Tu, Ho, Lei, Su,
     * Ma, Les, Le, La, Du, Una, Son, Das, Si, Ou, Sim, Moro) or begin place
     * names (Den Haag) */
    /* German */
    { "ich", FN }, { "er", FN }, { "sie", FN }, { "es", FN }, { "wir", FN }, { "ihr", FN }, { "mein", FN },
    { "meine", FN }, { "meinen", FN }, { "dein", FN }, { "deine", FN }, { "unser", FN }, { "unsere", FN },
    { "ein", FN }, { "eine", FN }, { "einen", FN }, { "die", FN }, { "der", FN },
    { "dem", FN }, { "und", FN }, { "aber", FN }, { "oder", FN }, { "wenn", FN }, { "weil", FN }, { "dass", FN },
    { "bitte", FN }, { "danke", FN }, { "hallo", FN }, { "ja", FN }, { "nein", FN }, { "wo", FN }, { "wie", FN },
    { "wer", FN }, { "warum", FN }, { "heute", FN }, { "morgen", FN }, { "gestern", FN }, { "hier", FN },
    { "dort", FN }, { "dann", FN }, { "jetzt", FN }, { "kann", FN }, { "k\xc3\xb6nnen", FN }, { "haben", FN },
    { "habe", FN }, { "hat", FN }, { "ist", FN }, { "sind", FN }, { "wird", FN }, { "auch", FN },
    { "nicht", FN }, { "noch", FN }, { "schon", FN }, { "sehr", FN }, { "liebe", FN }, { "lieber", FN },
    /* French */
    { "je", FN }, { "j'ai", FN }, { "il", FN }, { "nous", FN }, { "vous", FN }, { "ils", FN }, { "elles", FN },
    { "une", FN }, { "un", FN }, { "mes", FN }, { "notre", FN }, { "votre", FN }, { "leur", FN }, { "leurs", FN },
    { "ce", FN }, { "cet", FN }, { "cette", FN }, { "ces", FN }, { "bonjour", FN }, { "bonsoir", FN },
    { "merci", FN }, { "oui", FN }, { "non", FN }, { "et", FN }, { "mais", FN }, { "o\xc3\xb9", FN },
    { "quand", FN }, { "pourquoi", FN }, { "comment", FN }, { "salut", FN }, { "voici", FN },
    { "voil\xc3\xa0", FN }, { "c'est", FN },
    /* Spanish */
    { "yo", FN }, { "t\xc3\xba", FN }, { "\xc3\xa9l", FN }, { "nosotros", FN }, { "nosotras", FN },
    { "vosotros", FN }, { "ellos", FN }, { "ellas", FN }, { "usted", FN }, { "ustedes", FN }, { "mi", FN },
    { "mis", FN }, { "tus", FN }, { "nuestro", FN }, { "nuestra", FN }, { "hola", FN }, { "gracias", FN },
    { "por", FN }, { "para", FN }, { "con", FN }, { "pero", FN }, { "cuando", FN }, { "donde", FN },
    { "d\xc3\xb3nde", FN }, { "hoy", FN }, { "estoy", FN }, { "soy", FN }, { "es", FN }, { "tengo", FN },
    { "muy", FN }, { "buenos", FN }, { "buenas", FN },
    /* Italian */
    { "io", FN }, { "lui", FN }, { "noi", FN }, { "voi", FN }, { "loro", FN }, { "il", FN }, { "gli", FN },
    { "ciao", FN }, { "grazie", FN }, { "buongiorno", FN }, { "sono", FN }, { "mio", FN }, { "miei", FN },
    { "questo", FN }, { "questa", FN }, { "perch\xc3\xa9", FN }, { "oggi", FN }, { "domani", FN }, { "abbiamo", FN },
    { "anche", FN }, { "per\xc3\xb2", FN },
    /* Portuguese */
    { "eu", FN }, { "ele", FN }, { "ela", FN }, { "n\xc3\xb3s", FN }, { "voc\xc3\xaa", FN }, { "voc\xc3\xaas", FN },
    { "meu", FN }, { "minha", FN }, { "meus", FN }, { "minhas", FN }, { "ol\xc3\xa1", FN }, { "obrigado", FN },
    { "obrigada", FN }, { "n\xc3\xa3o", FN }, { "tamb\xc3\xa9m", FN }, { "hoje", FN },
    { "amanh\xc3\xa3", FN }, { "estou", FN }, { "sou", FN }, { "tenho", FN },
    /* Dutch */
    { "ik", FN }, { "jij", FN }, { "wij", FN }, { "zij", FN }, { "hij", FN }, { "het", FN }, { "een", FN },
    { "mijn", FN }, { "jouw", FN }, { "onze", FN }, { "bedankt", FN }, { "nee", FN }, { "vandaag", FN },
    { "woon", FN }, { "heb", FN },
    /* Russian, capitalised (the lookup folds ASCII only) */
    { "\xd0\xaf", FN }, { "\xd0\x9c\xd0\xb5\xd0\xbd\xd1\x8f", FN }, { "\xd0\x9c\xd0\xbd\xd0\xb5", FN },
    { "\xd0\x9c\xd0\xbe\xd0\xb9", FN }, { "\xd0\x9c\xd0\xbe\xd1\x8f", FN }, { "\xd0\x9c\xd0\xbe\xd1\x91", FN },
    { "\xd0\x9c\xd0\xbe\xd0\xb5", FN }, { "\xd0\x9c\xd1\x8b", FN }, { "\xd0\x92\xd1\x8b", FN },
    { "\xd0\xa2\xd1\x8b", FN }, { "\xd0\x9e\xd0\xbd", FN }, { "\xd0\x9e\xd0\xbd\xd0\xb0", FN },
    { "\xd0\x9e\xd0\xbd\xd0\xb8", FN }, { "\xd0\xad\xd1\x82\xd0\xbe", FN },
    { "\xd0\xad\xd1\x82\xd0\xbe\xd1\x82", FN }, { "\xd0\xad\xd1\x82\xd0\xb0", FN },
    { "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82", FN },
    { "\xd0\x97\xd0\xb4\xd1\x80\xd0\xb0\xd0\xb2\xd1\x81\xd1\x82\xd0\xb2\xd1\x83\xd0\xb9\xd1\x82\xd0\xb5", FN },
    { "\xd0\xa1\xd0\xbf\xd0\xb0\xd1\x81\xd0\xb8\xd0\xb1\xd0\xbe", FN },
    { "\xd0\x9f\xd0\xbe\xd0\xb6\xd0\xb0\xd0\xbb\xd1\x83\xd0\xb9\xd1\x81\xd1\x82\xd0\xb0", FN },
    { "\xd0\x94\xd0\xb0", FN }, { "\xd0\x9d\xd0\xb5\xd1\x82", FN }, { "\xd0\x92", FN }, { "\xd0\x9d\xd0\xb0", FN },
    { "\xd0\x98", FN }, { "\xd0\x90", FN }, { "\xd0\x9d\xd0\xbe", FN }, { "\xd0\x9a\xd0\xb0\xd0\xba", FN },
    { "\xd0\x93\xd0\xb4\xd0\xb5", FN }, { "\xd0\x9a\xd0\xbe\xd0\xb3\xd0\xb4\xd0\xb0", FN },
    { "\xd0\x9f\xd0\xbe\xd1\x87\xd0\xb5\xd0\xbc\xd1\x83", FN }, { "\xd0\xa7\xd1\x82\xd0\xbe", FN },
    { "\xd0\x9a\xd1\x82\xd0\xbe", FN }, { "\xd0\xa1\xd0\xb5\xd0\xb3\xd0\xbe\xd0\xb4\xd0\xbd\xd1\x8f", FN },
    { "\xd0\x97\xd0\xb0\xd0\xb2\xd1\x82\xd1\x80\xd0\xb0", FN }, { "\xd0\x92\xd1\x87\xd0\xb5\xd1\x80\xd0\xb0", FN },
    { "\xd0\x97\xd0\xb4\xd0\xb5\xd1\x81\xd1\x8c", FN }, { "\xd0\xa2\xd0\xb0\xd0\xbc", FN },
    { "\xd0\xa2\xd1\x83\xd1\x82", FN }, { "\xd0\xa3", FN }, { "\xd0\x95\xd0\xb3\xd0\xbe", FN },
    { "\xd0\x95\xd1\x91", FN }, { "\xd0\x95\xd0\xb5", FN }, { "\xd0\x98\xd1\x85", FN },
    /* capitalised forms that start with a non-ASCII letter */
    { "\xc3\x89l", FN },
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

uint32_t cp_names_lookup(const names *nm, const char *s, size_t n)
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
cp_status cp_names_words_load(wordlist *wl, const char *path, cp_error *err)
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

int cp_names_common_word(const wordlist *wl, const char *s, size_t n)
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

int cp_names_compound_street(const char *w, size_t n)
{
    for (size_t i = 0; i < sizeof street_suffixes / sizeof street_suffixes[0]; i++) {
        size_t l = street_suffixes[i].n;
        if (n >= l + 3 && w[n - 1] == street_suffixes[i].s[l - 1] && memcmp(w + n - l, street_suffixes[i].s, l) == 0) return 1;
    }
    return 0;
}

void cp_names_lexicon_fill(names *nm)
{
    for (size_t i = 0; i < N_LEX; i++) lex_insert(nm, lexicon[i].w, lexicon[i].f);
    for (size_t i = 0; i < sizeof countries / sizeof countries[0]; i++) lex_insert(nm, countries[i], L_GAZ | L_GAZLC);
    for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) lex_insert(nm, places[i], L_GAZ);
}
