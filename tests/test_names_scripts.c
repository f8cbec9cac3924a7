/* Names in non-Latin scripts (engine/detect/detect_names_scripts.c): after
 * a name cue (我叫, 名前は, 이름은, اسمي, मेरा नाम, меня зовут) and next to
 * an honorific (先生, さん, 씨, السيد, श्री, जी) the name is a person span,
 * whole characters, exact bytes; the same cue or honorific without a name
 * (我叫你, お客さん, 선생님, السيدات, जी हाँ) leaves the sentence shareable.
 * The sentences are written for this suite. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../engine/detect/detect.h"
#include "../tokenizer/utf8.h"
#include "helpers.h"

static cp_detect_chain names_chain(void) { return test_chain_of(cp_detector_names); }

/* the chain's spans of text (a user turn) as "type[start,end);..." */
static void spans_of(cp_detect_chain *c, const char *text, char *out, size_t cap)
{
    test_spans_at(c, text, strlen(text), CP_ROLE_USER, out, cap);
}

typedef struct named {
    const char *text, *name; /* name: the person span's text, found in text */
} named;

/* each text yields exactly one span, a person, over exactly its name's bytes */
static void assert_names(const named *cases, size_t n)
{
    cp_detect_chain c = names_chain();
    char got[512], want[64];
    for (size_t i = 0; i < n; i++) {
        const char *at = strstr(cases[i].text, cases[i].name);
        cr_assert(at, "case %zu: '%s' is not in its text", i, cases[i].name);
        size_t s = (size_t)(at - cases[i].text);
        snprintf(want, sizeof want, "person[%zu,%zu);", s, s + strlen(cases[i].name));
        spans_of(&c, cases[i].text, got, sizeof got);
        cr_assert_str_eq(got, want, "case %zu '%s': got '%s', want the name '%s'", i, cases[i].text, got, cases[i].name);
    }
    cp_chain_free(&c);
}

static void assert_none(const char *const *texts, size_t n)
{
    cp_detect_chain c = names_chain();
    char got[512];
    for (size_t i = 0; i < n; i++) {
        spans_of(&c, texts[i], got, sizeof got);
        cr_assert_str_eq(got, "", "'%s' flagged: %s", texts[i], got);
    }
    cp_chain_free(&c);
}

Test(names_scripts, name_after_a_cue_in_each_script)
{
    static const named cases[] = {
        /* Chinese: a surname and at most two more characters, up to the comma */
        { "我叫王小明，住在北京市朝阳区。", "王小明" },
        /* ... or up to a verb with no comma before it */
        { "我叫李华住在上海。", "李华" },
        /* ... or at most two characters after the surname, a comma or not */
        { "我叫王小明很高兴认识你。", "王小明" },
        /* a two-character surname takes up to four */
        { "她叫欧阳娜娜。", "欧阳娜娜" },
        /* a name field takes a name without a known surname */
        { "我的名字是小龙，谢谢。", "小龙" },
        { "姓名：钱多多", "钱多多" },
        /* Japanese: kanji up to the particle; hiragana up to です */
        { "私の名前は田中太郎です。", "田中太郎" },
        { "名前はさくらです。", "さくら" },
        { "氏名：山田花子", "山田花子" },
        { "私は佐藤と申します。", "佐藤" },
        /* Korean: the word after, less its copula or particle */
        { "제 이름은 김민준입니다.", "김민준" },
        { "이름이 박서연이에요.", "박서연" },
        { "제 이름은 이지은, 서울에 살아요.", "이지은" },
        /* Arabic: the name's words up to "and I live" */
        { "مرحبا، اسمي أحمد الخطيب وأسكن في عمان.", "أحمد الخطيب" },
        { "اسمي سارة وأنا من مصر.", "سارة" },
        /* ... after the copula, and with a joining word */
        { "اسمي هو محمد بن علي.", "محمد بن علي" },
        /* Hindi: the words up to the copula */
        { "मेरा नाम राहुल शर्मा है।", "राहुल शर्मा" },
        { "मेरा नाम है प्रिया।", "प्रिया" },
        /* Russian: a lowercase name after its cue, up to "and" */
        { "меня зовут иван петров и я живу в москве", "иван петров" },
        { "меня зовут иван и я живу в москве", "иван" },
        { "моё имя — анна.", "анна" },
    };
    assert_names(cases, sizeof cases / sizeof cases[0]);
}

Test(names_scripts, name_beside_an_honorific_in_each_script)
{
    static const named cases[] = {
        /* Chinese: the surname alone, a full name, a name inside a sentence */
        { "王先生的电话是多少？", "王" },
        { "请联系王小明先生。", "王小明" },
        { "张女士明天到。", "张" },
        { "我们的李老师很好。", "李" },
        /* Japanese: さん, 様 and 先生 (a Japanese surname, kana next to it) */
        { "田中さんに電話してください。", "田中" },
        { "田中様、ありがとうございます。", "田中" },
        { "山田先生に聞いてください。", "山田" },
        { "明日はマイクくんが来る。", "マイク" },
        /* Korean: 씨 attached or after a space, 님 after a full name */
        { "김민준씨가 왔어요.", "김민준" },
        { "내일 이지은 씨에게 전화하세요.", "이지은" },
        { "박지성님 안녕하세요.", "박지성" },
        /* Arabic: the honorific before, the name's words after it */
        { "السيد أحمد محمود في المكتب.", "أحمد محمود" },
        /* a third word only with the article or after a joining word (بن, عبد): not "works" */
        { "السيد أحمد محمود يعمل هنا.", "أحمد محمود" },
        { "اتصلت بالسيدة فاطمة الزهراء أمس.", "فاطمة الزهراء" },
        /* ... a title between them is no name */
        { "السيد الرئيس محمد قال ذلك.", "محمد" },
        /* Hindi: श्री / डॉ. before, जी after */
        { "श्री रमेश कुमार ने कहा।", "रमेश कुमार" },
        { "डॉ. सुनीता राव कल आएंगी।", "सुनीता राव" },
        { "कल शर्मा जी आ गए।", "शर्मा" },
    };
    assert_names(cases, sizeof cases / sizeof cases[0]);
}

Test(names_scripts, cue_or_honorific_without_a_name_is_not_flagged)
{
    static const char *const texts[] = {
        /* Chinese: 我叫 before a pronoun or a particle ("I tell you", "I ordered") */
        "我叫你明天早点来。",
        "我叫了外卖。",
        "我叫外卖吧。",
        /* 先生 / 老师 with no surname before them: "this gentleman", "my teacher", "the maths / high-school teacher" */
        "这位先生，请坐。",
        "我的老师很好。",
        "数学老师说明天考试。",
        "高中老师",
        "女士们，先生们。",
        /* Japanese: the words that take さん / 様 (the customer, everyone, the specification, the baker's) */
        "お客さんが来ました。",
        "皆様、こんにちは。",
        "製品の仕様を確認してください。",
        "パン屋さんに行った。",
        "みなさん、おはよう。",
        /* 名前は with no name after it: "no name yet", "what is your name" */
        "名前はまだない。",
        "名前は何ですか。",
        "名前はまだです。",
        /* 氏名 is the word "name", not an honorific */
        "氏名を書いてください。",
        /* 様式 "a form": 様 starting a longer word */
        "申請様式を送ってください。",
        /* Korean: teacher, customer, kind heart, weather; a question for the name */
        "선생님께 물어보세요.",
        "고객님 감사합니다.",
        "마음씨가 좋아요.",
        "날씨가 좋네요.",
        "이름은 무엇입니까?",
        "이름은 없습니다.",
        /* Arabic: "master in his house", "ladies and gentlemen", "Mr President said" */
        "هو السيد في بيته.",
        "السيدات والسادة",
        "السيد الرئيس قال ذلك.",
        /* Hindi: "yes sir", "mother", "what is your name" */
        "जी हाँ, ठीक है।",
        "माता जी घर पर हैं।",
        "आपका नाम क्या है?",
        /* Russian: "what is your name", "I am a student" */
        "как тебя зовут?",
        "я — студент.",
    };
    assert_none(texts, sizeof texts / sizeof texts[0]);
}

/* a cue at the message's end, cut characters and invalid bytes (the chain
 * fails such a message closed; the detector itself must still read it
 * safely): spans stay inside the message and on character boundaries */
Test(names_scripts, spans_are_whole_characters_inside_odd_input)
{
    static const char *const texts[] = {
        "我叫", "我叫王", "我叫王\xe5\xb0", "\xe5\xb0\x8f先生", "\x80\x80先生", "さん", "名前は", "이름은", "씨", "اسمي", "जी",
        "меня зовут", "я —", "\xff\xfe我叫王小明\xff", "السيد \xd8", "श्री \xe0\xa4", "\xa4王先生", "我叫王小\x80明",
    };
    cp_detector *d;
    cp_error err = { 0 };
    cr_assert_eq(cp_detector_names(&d, &err), CP_OK, "%s", err.msg);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t len = strlen(texts[i]);
        cp_spans s = { 0 };
        cr_assert_eq(d->detect(d, texts[i], len, CP_ROLE_USER, &s, &err), CP_OK, "%s", err.msg);
        /* the character boundaries: a well-formed character is one, an invalid byte is one on its own */
        char edge[64] = { 0 };
        cr_assert_lt(len, sizeof edge);
        for (size_t b = 0; b <= len;) {
            uint32_t cp;
            int l = b < len ? cp_utf8_len((const unsigned char *)texts[i] + b, len - b, &cp) : 1;
            edge[b] = 1;
            b += l ? (size_t)l : 1;
        }
        for (size_t k = 0; k < s.n; k++) {
            cr_assert(s.v[k].start < s.v[k].end && s.v[k].end <= len, "case %zu: span [%u,%u) of %zu bytes", i, s.v[k].start,
                      s.v[k].end, len);
            cr_assert(edge[s.v[k].start] && edge[s.v[k].end], "case %zu: span [%u,%u) cuts a character", i, s.v[k].start,
                      s.v[k].end);
        }
        cp_spans_free(&s);
    }
    d->destroy(d);
}
