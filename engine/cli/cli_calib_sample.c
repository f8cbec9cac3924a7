/* The built-in sample automatic calibration measures on when no
 * --calib-requests is given: ten passages of Lewis Carroll's "Alice's
 * Adventures in Wonderland" (1865, public domain; Project Gutenberg eBook
 * #11, the reference kit's data/gutenberg/pg11_alice_in_wonderland.txt:
 * paragraphs joined with single spaces from ten evenly spread places, about
 * 9 KB in all) sent by six tenants as documents, alone and then after
 * two other passages, with a short question each, so half the requests reuse
 * KV computed in another context: what recompute is there to repair. */
#include "cli_calib_sample.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const passages[] = {
    "'How doth the little crocodile Improve his shining tail, And pour the waters of the Nile On ever"
    "y golden scale! 'How cheerfully he seems to grin, How neatly spread his claws, And welcome littl"
    "e fishes in With gently smiling jaws!' 'I'm sure those are not the right words,' said poor Alice"
    ", and her eyes filled with tears again as she went on, 'I must be Mabel after all, and I shall h"
    "ave to go and live in that poky little house, and have next to no toys to play with, and oh! eve"
    "r so many lessons to learn! No, I've made up my mind about it; if I'm Mabel, I'll stay down here"
    "! It'll be no use their putting their heads down and saying \"Come up again, dear!\" I shall onl"
    "y look up and say \"Who am I then? Tell me that first, and then, if I like being that person, I'"
    "ll come up: if not, I'll stay down here till I'm somebody else\"--but, oh dear!' cried Alice, wi"
    "th a sudden burst of tears, 'I do wish they WOULD put their heads down! I am so VERY tired of be"
    "ing all alone here!'",
    "'Digging for apples, indeed!' said the Rabbit angrily. 'Here! Come and help me out of THIS!' (So"
    "unds of more broken glass.) 'Now tell me, Pat, what's that in the window?' 'Sure, it's an arm, y"
    "er honour!' (He pronounced it 'arrum.') 'An arm, you goose! Who ever saw one that size? Why, it "
    "fills the whole window!' 'Sure, it does, yer honour: but it's an arm for all that.' 'Well, it's "
    "got no business there, at any rate: go and take it away!' There was a long silence after this, a"
    "nd Alice could only hear whispers now and then; such as, 'Sure, I don't like it, yer honour, at "
    "all, at all!' 'Do as I tell you, you coward!' and at last she spread out her hand again, and mad"
    "e another snatch in the air. This time there were TWO little shrieks, and more sounds of broken "
    "glass. 'What a number of cucumber-frames there must be!' thought Alice. 'I wonder what they'll d"
    "o next! As for pulling me out of the window, I only wish they COULD! I'm sure I don't want to st"
    "ay in here any longer!'",
    "* * * * * * * * * * * * * 'Come, my head's free at last!' said Alice in a tone of delight, which"
    " changed into alarm in another moment, when she found that her shoulders were nowhere to be foun"
    "d: all she could see, when she looked down, was an immense length of neck, which seemed to rise "
    "like a stalk out of a sea of green leaves that lay far below her. 'What CAN all that green stuff"
    " be?' said Alice. 'And where HAVE my shoulders got to? And oh, my poor hands, how is it I can't "
    "see you?' She was moving them about as she spoke, but no result seemed to follow, except a littl"
    "e shaking among the distant green leaves. As there seemed to be no chance of getting her hands u"
    "p to her head, she tried to get her head down to them, and was delighted to find that her neck w"
    "ould bend about easily in any direction, like a serpent. She had just succeeded in curving it do"
    "wn into a graceful zigzag, and was going to dive in among the leaves, which she found to be noth"
    "ing but the tops of the trees under which she had been wandering, when a sharp hiss made her dra"
    "w back in a hurry: a large pigeon had flown into her face, and was beating her violently with it"
    "s wings.",
    "Alice felt that this could not be denied, so she tried another question. 'What sort of people li"
    "ve about here?' 'In THAT direction,' the Cat said, waving its right paw round, 'lives a Hatter: "
    "and in THAT direction,' waving the other paw, 'lives a March Hare. Visit either you like: they'r"
    "e both mad.' 'But I don't want to go among mad people,' Alice remarked. 'Oh, you can't help that"
    ",' said the Cat: 'we're all mad here. I'm mad. You're mad.' 'How do you know I'm mad?' said Alic"
    "e. 'You must be,' said the Cat, 'or you wouldn't have come here.' Alice didn't think that proved"
    " it at all; however, she went on 'And how do you know that you're mad?' 'To begin with,' said th"
    "e Cat, 'a dog's not mad. You grant that?' 'I suppose so,' said Alice. 'Well, then,' the Cat went"
    " on, 'you see, a dog growls when it's angry, and wags its tail when it's pleased. Now I growl wh"
    "en I'm pleased, and wag my tail when I'm angry. Therefore I'm mad.'",
    "'And ever since that,' the Hatter went on in a mournful tone, 'he won't do a thing I ask! It's a"
    "lways six o'clock now.' A bright idea came into Alice's head. 'Is that the reason so many tea-th"
    "ings are put out here?' she asked. 'Yes, that's it,' said the Hatter with a sigh: 'it's always t"
    "ea-time, and we've no time to wash the things between whiles.' 'Then you keep moving round, I su"
    "ppose?' said Alice. 'Exactly so,' said the Hatter: 'as the things get used up.' 'But what happen"
    "s when you come to the beginning again?' Alice ventured to ask. 'Suppose we change the subject,'"
    " the March Hare interrupted, yawning. 'I'm getting tired of this. I vote the young lady tells us"
    " a story.' 'I'm afraid I don't know one,' said Alice, rather alarmed at the proposal. 'Then the "
    "Dormouse shall!' they both cried. 'Wake up, Dormouse!' And they pinched it on both sides at once"
    ".",
    "'Yes!' shouted Alice. 'Come on, then!' roared the Queen, and Alice joined the procession, wonder"
    "ing very much what would happen next. 'It's--it's a very fine day!' said a timid voice at her si"
    "de. She was walking by the White Rabbit, who was peeping anxiously into her face. 'Very,' said A"
    "lice: '--where's the Duchess?' 'Hush! Hush!' said the Rabbit in a low, hurried tone. He looked a"
    "nxiously over his shoulder as he spoke, and then raised himself upon tiptoe, put his mouth close"
    " to her ear, and whispered 'She's under sentence of execution.' 'What for?' said Alice. 'Did you"
    " say \"What a pity!\"?' the Rabbit asked. 'No, I didn't,' said Alice: 'I don't think it's at all"
    " a pity. I said \"What for?\"' 'She boxed the Queen's ears--' the Rabbit began. Alice gave a lit"
    "tle scream of laughter. 'Oh, hush!' the Rabbit whispered in a frightened tone. 'The Queen will h"
    "ear you! You see, she came rather late, and the Queen said--'",
    "'Come on, then,' said the Queen, 'and he shall tell you his history,' As they walked off togethe"
    "r, Alice heard the King say in a low voice, to the company generally, 'You are all pardoned.' 'C"
    "ome, THAT'S a good thing!' she said to herself, for she had felt quite unhappy at the number of "
    "executions the Queen had ordered. They very soon came upon a Gryphon, lying fast asleep in the s"
    "un. (IF you don't know what a Gryphon is, look at the picture.) 'Up, lazy thing!' said the Queen"
    ", 'and take this young lady to see the Mock Turtle, and to hear his history. I must go back and "
    "see after some executions I have ordered'; and she walked off, leaving Alice alone with the Gryp"
    "hon. Alice did not quite like the look of the creature, but on the whole she thought it would be"
    " quite as safe to stay with it as to go after that savage Queen: so she waited.",
    "Will you, won't you, will you, won't you, will you join the dance? Will you, won't you, will you"
    ", won't you, won't you join the dance?\"' 'Thank you, it's a very interesting dance to watch,' s"
    "aid Alice, feeling very glad that it was over at last: 'and I do so like that curious song about"
    " the whiting!' 'Oh, as to the whiting,' said the Mock Turtle, 'they--you've seen them, of course"
    "?' 'Yes,' said Alice, 'I've often seen them at dinn--' she checked herself hastily. 'I don't kno"
    "w where Dinn may be,' said the Mock Turtle, 'but if you've seen them so often, of course you kno"
    "w what they're like.' 'I believe so,' Alice replied thoughtfully. 'They have their tails in thei"
    "r mouths--and they're all over crumbs.' 'You're wrong about the crumbs,' said the Mock Turtle: '"
    "crumbs would all wash off in the sea. But they HAVE their tails in their mouths; and the reason "
    "is--' here the Mock Turtle yawned and shut his eyes.--'Tell her about the reason and all that,' "
    "he said to the Gryphon.",
    "'I keep them to sell,' the Hatter added as an explanation; 'I've none of my own. I'm a hatter.' "
    "Here the Queen put on her spectacles, and began staring at the Hatter, who turned pale and fidge"
    "ted. 'Give your evidence,' said the King; 'and don't be nervous, or I'll have you executed on th"
    "e spot.' This did not seem to encourage the witness at all: he kept shifting from one foot to th"
    "e other, looking uneasily at the Queen, and in his confusion he bit a large piece out of his tea"
    "cup instead of the bread-and-butter. Just at this moment Alice felt a very curious sensation, wh"
    "ich puzzled her a good deal until she made out what it was: she was beginning to grow larger aga"
    "in, and she thought at first she would get up and leave the court; but on second thoughts she de"
    "cided to remain where she was as long as there was room for her.",
    "'He must have imitated somebody else's hand,' said the King. (The jury all brightened up again.)"
    " 'Please your Majesty,' said the Knave, 'I didn't write it, and they can't prove I did: there's "
    "no name signed at the end.' 'If you didn't sign it,' said the King, 'that only makes the matter "
    "worse. You MUST have meant some mischief, or else you'd have signed your name like an honest man"
    ".' There was a general clapping of hands at this: it was the first really clever thing the King "
    "had said that day. 'That PROVES his guilt,' said the Queen. 'It proves nothing of the sort!' sai"
    "d Alice. 'Why, you don't even know what they're about!' 'Read them,' said the King. The White Ra"
    "bbit put on his spectacles. 'Where shall I begin, please your Majesty?' he asked. 'Begin at the "
    "beginning,' the King said gravely, 'and go on till you come to the end: then stop.'",
};
#define N_PASSAGES ((int)(sizeof passages / sizeof passages[0]))

static const char *const questions[] = {
    "What happens next?", "Who is speaking here?", "Tell the story in one sentence.", "Why is Alice surprised?",
    "Where does this take place?", "What does Alice want?", "Continue the story.", "Which part is the funniest?",
};
#define N_QUESTIONS ((int)(sizeof questions / sizeof questions[0]))

static cJSON *message(const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    if (m && (!cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", content))) cJSON_Delete(m), m = NULL;
    return m;
}

/* request 2k: passage k alone (its KV stored at the start of a prompt);
 * request 2k + 1: two other passages, then passage k again, whose stored
 * KV is now reused after text it was not computed after */
static char *request(int i)
{
    char tenant[16];
    snprintf(tenant, sizeof tenant, "sample-%d", i % 6);
    int k = i / 2, pair = i % 2;
    const char *docs[3] = { passages[(k + 3) % N_PASSAGES], passages[(k + 6) % N_PASSAGES], passages[k % N_PASSAGES] };
    cJSON *o = cJSON_CreateObject(), *ms = o ? cJSON_AddArrayToObject(o, "messages") : NULL;
    int ok = ms && cJSON_AddStringToObject(o, "tenant", tenant) && cJSON_AddNumberToObject(o, "max_tokens", 16);
    for (int d = pair ? 0 : 2; ok && d < 3; d++) {
        cJSON *m = message("document", docs[d]);
        ok = m && cJSON_AddItemToArray(ms, m);
    }
    cJSON *u = ok ? message("user", questions[i % N_QUESTIONS]) : NULL;
    ok = u && cJSON_AddItemToArray(ms, u);
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

cp_status cli_calib_sample_jsonl(int n, char **out, size_t *len, cp_error *err)
{
    if (n <= 0 || n > CLI_CALIB_SAMPLE_REQUESTS) n = CLI_CALIB_SAMPLE_REQUESTS;
    size_t cap = 1, used = 0;
    char *buf = NULL;
    for (int i = 0; i < n; i++) {
        char *line = request(i);
        size_t l = line ? strlen(line) : 0;
        char *nb = line ? realloc(buf, cap + l + 1) : NULL;
        if (!nb) {
            free(line), free(buf);
            return cp_fail(err, CP_ENOMEM, "calibration sample: out of memory at request %d", i);
        }
        buf = nb, cap += l + 1;
        memcpy(buf + used, line, l), used += l, buf[used++] = '\n';
        free(line);
    }
    buf[used] = 0;
    *out = buf, *len = used;
    return CP_OK;
}
