/* Names in scripts the word scanner cannot read: Chinese, Japanese, Korean,
 * Arabic, Devanagari (Hindi) and Cyrillic (Russian).
 *
 * Why a pass of its own: the word scanner (detect_names_words.c) finds
 * names by capitals and spaces.  Han, kana, Hangul, Arabic and Devanagari
 * have no capitals, and Chinese and Japanese no spaces, so "我叫王小明，"
 * is one word with no shape to go by, and a name there is only found by
 * the words around it: a cue before it (我叫, 名前は, 이름은, اسمي, मेरा
 * नाम, меня зовут) or an honorific next to it (さん, 先生, 씨, السيد,
 * श्री, जी).  This pass looks for those cues in the message's bytes and
 * marks the name they point at, a bounded number of characters or words
 * away.  A lowercase Russian name after its cue is found here too; a
 * capitalised one is also a capitalised run for the word rules (the
 * chain's resolution keeps one span).
 *
 * Precision: each cue has near misses (我叫你 "I call you", お客さん "the
 * customer", 선생님 "teacher", السيدات "ladies", जी हाँ "yes sir"), so
 * names must start with a known surname where the script gives no other
 * evidence (Chinese, Korean), common words that take the honorific are
 * listed out (Japanese, Korean, Hindi), and function words end a name.
 *
 * Linear time: the cues are compared only at lead bytes of non-ASCII
 * characters, and from a cue the rules read at most a constant number of
 * characters (MAX_CHARS) or words (3 of at most MAX_CHARS each), forward
 * or back; every character read is counted in *steps. */
#include <stdint.h>
#include <string.h>
#include <utf8proc.h>

#include "../../tokenizer/utf8.h"
#include "detect_names_internal.h"

#define MAX_CHARS 24 /* the most characters a rule reads from its cue (a longer "word" is no name) */

/* ---- characters ------------------------------------------------------------ */

/* the code point at t[i] and its length (an invalid byte: U+FFFD, 1 byte) */
static uint32_t cp_at(const char *t, size_t len, size_t i, size_t *l)
{
    uint32_t cp;
    int n = cp_utf8_len((const unsigned char *)t + i, len - i, &cp);
    *l = n ? (size_t)n : 1;
    return n ? cp : 0xfffd;
}

/* the code point ending at byte e (> 0) and where it starts */
static uint32_t cp_before(const char *t, size_t e, size_t *start)
{
    size_t b = e - 1;
    while (b > 0 && e - b < 4 && cp_utf8_continues((unsigned char)t[b])) b--;
    uint32_t cp;
    int n = cp_utf8_len((const unsigned char *)t + b, e - b, &cp);
    if (n == 0 || b + (size_t)n != e) {
        *start = e - 1;
        return 0xfffd;
    }
    *start = b;
    return cp;
}

static int is_han(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0xF900 && c <= 0xFAFF) ||
           (c >= 0x20000 && c <= 0x2FA1F) || c == 0x3005; /* 々 repeats the kanji before it (佐々木) */
}
static int is_hira(uint32_t c) { return c >= 0x3041 && c <= 0x309F; }
/* katakana with ー and the ・ between a foreign name's parts (ジョン・スミス) */
static int is_kata(uint32_t c) { return (c >= 0x30A1 && c <= 0x30FF) || (c >= 0x31F0 && c <= 0x31FF); }
static int is_kana(uint32_t c) { return is_hira(c) || is_kata(c); }
static int is_hangul(uint32_t c) { return c >= 0xAC00 && c <= 0xD7A3; }
/* a Japanese name's characters: kanji and katakana (hiragana is its particles) */
static int ja_name_char(uint32_t c) { return is_han(c) || is_kata(c); }

enum { SC_ARABIC, SC_DEVANAGARI, SC_CYRILLIC };

/* a letter or mark of script sc (Devanagari's vowel signs are marks; its danda and digits are neither) */
static int in_script(uint32_t c, int sc)
{
    int ok = sc == SC_ARABIC ? (c >= 0x0600 && c <= 0x06FF) || (c >= 0x0750 && c <= 0x077F)
           : sc == SC_DEVANAGARI ? c >= 0x0900 && c <= 0x097F
                                 : c >= 0x0400 && c <= 0x04FF;
    if (!ok) return 0;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME);
}

/* a space between words: ASCII, no-break, ideographic */
static int is_space(uint32_t c) { return c == ' ' || c == '\t' || c == 0xA0 || c == 0x3000; }

/* whether t[s..e) is one of the words of list, written " w1 w2 ... " (a
 * list of single characters is a list of one-character words) */
static int listed(const char *list, const char *t, size_t s, size_t e)
{
    char key[MAX_CHARS * 4 + 3];
    if (e <= s || e - s > sizeof key - 3) return 0;
    key[0] = ' ';
    memcpy(key + 1, t + s, e - s);
    key[e - s + 1] = ' ';
    key[e - s + 2] = 0;
    return strstr(list, key) != NULL;
}

/* ---- word lists (written for this file) --------------------------------------- */

/* The commonest Chinese surnames (simplified and traditional), and the
 * two-character ones: a name by cue or honorific must start with one,
 * where 我叫外卖 ("I ordered takeout") or 数学老师 ("the maths teacher")
 * would otherwise be taken for a name. */
static const char zh_surnames[] =
    " 王 李 张 張 刘 劉 陈 陳 杨 楊 黄 黃 赵 趙 吴 吳 周 徐 孙 孫 马 馬 朱 胡 郭 何 高 林 罗 羅 郑 鄭 梁 谢 謝 宋 唐 许 許"
    " 韩 韓 冯 馮 邓 鄧 曹 彭 曾 肖 蕭 田 董 袁 潘 于 蒋 蔣 蔡 余 杜 叶 葉 程 苏 蘇 魏 吕 呂 丁 任 沈 姚 卢 盧 姜 崔 钟 鍾 谭"
    " 譚 陆 陸 汪 范 金 石 廖 贾 賈 夏 韦 韋 付 傅 方 白 邹 鄒 孟 熊 秦 邱 江 尹 薛 闫 閆 段 雷 侯 龙 龍 史 陶 黎 贺 賀 顾 顧"
    " 毛 郝 龚 龔 邵 万 萬 钱 錢 严 嚴 覃 武 戴 莫 孔 向 汤 湯 欧 歐 易 常 温 溫 康 施 牛 樊 葛 邢 安 齐 齊 伍 乔 喬 庞 龐 "
    " 欧阳 歐陽 司马 司馬 诸葛 諸葛 上官 东方 東方 慕容 令狐 皇甫 司徒 夏侯 公孙 公孫 端木 ";
/* characters that end a Chinese name: function words, verbs and pronouns
 * that follow or precede one (王小明住在..., 和王先生, 这位先生) */
static const char zh_stop[] = " 的 了 是 在 住 和 与 與 跟 及 我 你 您 他 她 它 们 們 这 這 那 也 都 就 还 還 说 說 要 想 会 會 去"
                              " 到 给 給 把 被 对 對 请 請 吗 嗎 呢 吧 啊 没 沒 不 今 从 從 位 个 個 各 叫 为 為 让 讓 问 問 找 见 見 ";
/* two characters that start with a surname but name no one before 老师 (高中老师: a high-school teacher) */
static const char zh_not_name[] = " 高中 高级 高級 金牌 万能 萬能 ";

/* Words that take さん/様/くん/ちゃん/君/氏 and are no name (お客さん, 皆様,
 * 仕様 "specification", パン屋さん, 社長さん, ご主人様, 彼氏): the last one or
 * two characters before the honorific. */
static const char ja_not_name[] = " 客 皆 奥 父 母 兄 姉 爺 婆 屋 者 員 手 家 嬢 坊 娘 仕 模 同 多 異 一 神 王 殿 両 各 貴 上 外"
                                  " 有 何 此 赤 諸 労 走 様 師 長 工 彼 主人 旦那 ";
/* what 名前は points at that is no name: 何 (名前は何ですか), 不明, 未定, 無し; まだ (名前はまだない) */
static const char ja_not_first[] = " 何 不 未 無 ";
static const char ja_hira_not_name[] = " まだ なに なん ない ひみつ ありません ";

/* The commonest Korean surnames (their syllables that are also particles
 * or everyday words -- 가, 은, 제, 사, 부 -- left out) and the two-syllable ones */
static const char ko_surnames[] = " 김 이 박 최 정 강 조 윤 장 임 한 오 서 신 권 황 안 송 류 유 전 홍 고 문 양 손 배 백 허 남 심"
                                  " 노 하 곽 성 차 주 우 구 민 진 지 엄 채 원 천 방 공 현 함 변 염 여 추 도 소 석 선 설 마 길"
                                  " 연 위 표 명 반 왕 금 옥 육 맹 탁 국 편 봉 복 태 목 형 피 감 ";
static const char ko_surnames2[] = " 남궁 선우 제갈 황보 독고 사공 서문 ";
/* the copula and particles after a name (김민준입니다, 김민준이고, 김지수예요) */
static const char *const ko_suffixes[] = { "입니다만", "입니다", "입니까", "이에요", "이고요", "이구요", "이라고", "이라는", "인데요",
                                           "예요",     "이고",   "이야",   "라고",   "라는",   "이며",   "인데",   "이요" };
/* what 이름은 points at that is no name (이름은 무엇입니까, 이름은 비밀이에요) */
static const char ko_not_name[] = " 무엇 뭐 뭔가 비밀 모름 없음 ";
/* words with a surname's first syllable that take 씨 or 님 (마음씨 "kind heart", 이사장님 "chairman") */
static const char ko_not_ssi[] = " 마음 말 ";
static const char ko_not_nim[] = " 이사장 조교수 정교수 부교수 부회장 부사장 부원장 부총장 ";

/* Arabic words that end a name: prepositions, pronouns, verbs of speech */
static const char ar_stop[] = " في من على إلى الى عن هو هي أنا انا أن ان إن الذي التي مع قال قالت كان كانت هذا هذه ذلك تلك لا لم"
                              " لن ما ليس يا أيضا جدا و أو ثم لكن ";
/* titles after السيد / الدكتور that are no name (السيد الرئيس "Mr President") */
static const char ar_titles[] = " الرئيس الرئيسة الوزير الوزيرة المدير المديرة المحترم المحترمة الفاضل الفاضلة الكريم الكريمة النائب"
                                " المسؤول الطبيب المعالج الجديد العام الأمين السفير الدكتور الدكتورة المهندس المهندسة الأستاذ الأستاذة ";
/* parts that join a name's words (أحمد بن علي, عبد الله) */
static const char ar_joins[] = " بن ابن بنت أبو ابو عبد ";

/* Hindi words that end a name: the copula, postpositions, conjunctions */
static const char hi_stop[] = " है हैं हूँ हूं था थी थे और या तथा क्या को का की के ने से में पर भी ही तो नहीं मैं मेरा मेरी जी हाँ हां "
                              " नमस्ते धन्यवाद प्रिय आदरणीय कौन कल आज अब फिर जब तब सब कि लेकिन यहाँ वहाँ यहां वहां ";
/* family words that take जी and are no name (माता जी, पिता जी) */
static const char hi_not_ji[] = " माता पिता पिताजी माताजी गुरु बाबा भाई दीदी माँ मां चाचा चाची मामा मामी दादा दादी नाना नानी बहन आप ";

/* Russian words that end a lowercase name (меня зовут иван и я живу ...) */
static const char ru_stop[] = " и а но я ты он она мы вы они в на из с у к по за о об от до для это как что где когда тоже не так"
                              " меня мне его её ее их живу работаю был была очень просто ";

/* ---- cues ------------------------------------------------------------------- */

enum {
    ZH_CALL,    /* 我叫 X: X starts with a surname (or 小 / 阿, a familiar name) */
    ZH_NAME,    /* 名字是 X, 姓名：X: two to four Han characters */
    ZH_HON,     /* X 女士 / 小姐 / 老师: X starts with a surname */
    ZH_JA_HON,  /* X 先生: Chinese (a surname) or Japanese (kanji next to kana) */
    JA_NAME,    /* 名前は X */
    JA_MOSU,    /* X と申します */
    JA_HON,     /* X さん / さま / くん / ちゃん */
    JA_HON_HAN, /* X 様 / 君 / 氏 / 殿: not the start of a longer word (様子, 氏名, 君主) */
    KO_NAME,    /* 이름은 X */
    KO_SSI,     /* X 씨 */
    KO_NIM,     /* X 님 */
    AR_NAME,    /* اسمي X */
    AR_HON,     /* السيد X */
    HI_NAME,    /* मेरा नाम X */
    HI_HON,     /* श्री X */
    HI_JI,      /* X जी */
    RU_NAME,    /* меня зовут X: X capitalised or not */
    RU_IAM,     /* Я — X: X capitalised */
};

typedef struct cue {
    const char *s;
    uint8_t kind;
} cue;

/* a cue that is the start of a longer one comes after it (السيدة before السيد) */
static const cue cues[] = {
    { "我叫", ZH_CALL }, { "他叫", ZH_CALL }, { "她叫", ZH_CALL }, { "名叫", ZH_CALL },
    { "名字是", ZH_NAME }, { "名字叫", ZH_NAME }, { "姓名是", ZH_NAME }, { "姓名：", ZH_NAME }, { "姓名:", ZH_NAME },
    { "女士", ZH_HON }, { "小姐", ZH_HON }, { "老师", ZH_HON }, { "老師", ZH_HON }, { "先生", ZH_JA_HON },
    { "名前は", JA_NAME }, { "名前が", JA_NAME }, { "氏名：", JA_NAME }, { "氏名:", JA_NAME },
    { "と申します", JA_MOSU }, { "と申す", JA_MOSU },
    { "さん", JA_HON }, { "さま", JA_HON }, { "くん", JA_HON }, { "ちゃん", JA_HON },
    { "様", JA_HON_HAN }, { "君", JA_HON_HAN }, { "氏", JA_HON_HAN }, { "殿", JA_HON_HAN },
    { "이름은", KO_NAME }, { "이름이", KO_NAME }, { "성함은", KO_NAME }, { "성함이", KO_NAME },
    { "씨", KO_SSI }, { "님", KO_NIM },
    { "اسمي", AR_NAME }, { "اسمه", AR_NAME }, { "اسمها", AR_NAME }, { "يدعى", AR_NAME }, { "تدعى", AR_NAME },
    { "السيدة", AR_HON }, { "السيد", AR_HON }, { "الدكتورة", AR_HON }, { "الدكتور", AR_HON }, { "الأستاذة", AR_HON },
    { "الأستاذ", AR_HON }, { "الآنسة", AR_HON }, { "الشيخ", AR_HON },
    { "मेरा नाम", HI_NAME }, { "उसका नाम", HI_NAME }, { "उनका नाम", HI_NAME }, { "आपका नाम", HI_NAME },
    { "श्रीमती", HI_HON }, { "सुश्री", HI_HON }, { "श्री", HI_HON }, { "डॉक्टर", HI_HON }, { "डॉ", HI_HON }, { "जी", HI_JI },
    { "меня зовут", RU_NAME }, { "Меня зовут", RU_NAME }, { "его зовут", RU_NAME }, { "Его зовут", RU_NAME },
    { "её зовут", RU_NAME }, { "Её зовут", RU_NAME }, { "ее зовут", RU_NAME }, { "Ее зовут", RU_NAME },
    { "моё имя", RU_NAME }, { "Моё имя", RU_NAME }, { "мое имя", RU_NAME }, { "Мое имя", RU_NAME },
    { "я —", RU_IAM }, { "Я —", RU_IAM }, { "я –", RU_IAM }, { "Я –", RU_IAM },
};
#define N_CUES (sizeof cues / sizeof cues[0])

/* ---- reading names ------------------------------------------------------------- */

typedef struct reader {
    const char *t;
    size_t len;
    uint64_t *steps;
} reader;

/* past the spaces, colons and dashes between a cue and its name (a few at most) */
static size_t skip_gap(const reader *r, size_t p)
{
    for (int k = 0; k < 4 && p < r->len; k++) {
        size_t l;
        uint32_t c = cp_at(r->t, r->len, p, &l);
        if (!is_space(c) && c != ':' && c != 0xFF1A && c != '-' && c != 0x2013 && c != 0x2014) break;
        p += l, ++*r->steps;
    }
    return p;
}

/* Han characters from p (none of zh_stop), at most max: their byte starts in at[0..n], at[n] the end */
static int han_forward(const reader *r, size_t p, int max, size_t *at)
{
    int n = 0;
    at[0] = p;
    while (n < max && p < r->len) {
        size_t l;
        uint32_t c = cp_at(r->t, r->len, p, &l);
        ++*r->steps;
        if (!is_han(c) || listed(zh_stop, r->t, p, p + l)) break;
        p += l;
        at[++n] = p;
    }
    return n;
}

/* Han characters ending at e (none of zh_stop), at most max: at[k] is where the k-th one back starts, at[0] = e */
static int han_back(const reader *r, size_t e, int max, size_t *at)
{
    int n = 0;
    at[0] = e;
    while (n < max && e > 0) {
        size_t b;
        uint32_t c = cp_before(r->t, e, &b);
        ++*r->steps;
        if (!is_han(c) || listed(zh_stop, r->t, b, e)) break;
        e = b;
        at[++n] = e;
    }
    return n;
}

/* a Chinese name read forward from p: a surname (one or two characters)
 * and at most two more; any_start takes a name without a known surname */
static int zh_after(const reader *r, size_t p, int any_start, size_t *s, size_t *e)
{
    size_t at[5];
    p = skip_gap(r, p);
    int n = han_forward(r, p, 4, at);
    if (n < 2) return 0; /* one character after 我叫 is a verb's object (我叫车), not a name */
    int sur2 = listed(zh_surnames, r->t, at[0], at[2]);
    int sur = sur2 || listed(zh_surnames, r->t, at[0], at[1]);
    if (!sur && !any_start && !listed(" 小 阿 ", r->t, at[0], at[1])) return 0;
    if (n > (sur2 ? 4 : 3)) n = sur2 ? 4 : 3;
    *s = at[0], *e = at[n];
    return 1;
}

/* a Chinese name ending at e: the furthest surname back that leaves at
 * most two characters of given name (王小明先生, 和王先生: 王) */
static int zh_before(const reader *r, size_t e, size_t *s)
{
    size_t at[5];
    int n = han_back(r, e, 4, at);
    for (int k = n; k >= 2; k--) /* 欧阳明先生: a two-character surname */
        if (k - 2 <= 2 && listed(zh_surnames, r->t, at[k], at[k - 2])) {
            *s = at[k];
            return 1;
        }
    for (int k = n < 3 ? n : 3; k >= 1; k--)
        if (listed(zh_surnames, r->t, at[k], at[k - 1]) && !(k >= 2 && listed(zh_not_name, r->t, at[k], at[k - 2]))) {
            *s = at[k];
            return 1;
        }
    return 0;
}

/* kanji and katakana ending at e, at most max: where they start (e if none) */
static size_t ja_back(const reader *r, size_t e, int max)
{
    for (int n = 0; n < max && e > 0; n++) {
        size_t b;
        uint32_t c = cp_before(r->t, e, &b);
        ++*r->steps;
        if (!ja_name_char(c)) break;
        e = b;
    }
    return e;
}

static uint32_t cp_prev(const reader *r, size_t e)
{
    size_t b;
    return e > 0 ? cp_before(r->t, e, &b) : 0;
}

static uint32_t cp_next(const reader *r, size_t p)
{
    size_t l;
    return p < r->len ? cp_at(r->t, r->len, p, &l) : 0;
}

/* a Japanese name before an honorific at [hs, he): not one of the words that take it */
static int ja_before(const reader *r, size_t hs, size_t *s)
{
    size_t b = ja_back(r, hs, 6), b1;
    if (b == hs) return 0;
    cp_before(r->t, hs, &b1);
    if (listed(ja_not_name, r->t, b1, hs)) return 0;
    if (b1 > b) {
        size_t b2;
        cp_before(r->t, b1, &b2);
        if (listed(ja_not_name, r->t, b2, hs)) return 0;
    }
    *s = b;
    return 1;
}

/* 名前は X: kanji and katakana, or hiragana right before です */
static int ja_after(const reader *r, size_t p, size_t *s, size_t *e)
{
    p = skip_gap(r, p);
    size_t q = p, l;
    for (int n = 0; n < 8 && q < r->len && ja_name_char(cp_at(r->t, r->len, q, &l)); n++) q += l, ++*r->steps;
    if (q > p) {
        cp_at(r->t, r->len, p, &l);
        if (listed(ja_not_first, r->t, p, p + l)) return 0;
        *s = p, *e = q;
        return 1;
    }
    for (int n = 0; n < 8 && q < r->len && is_hira(cp_at(r->t, r->len, q, &l)); n++) {
        static const char desu[] = "です";
        if (q > p && r->len - q >= sizeof desu - 1 && memcmp(r->t + q, desu, sizeof desu - 1) == 0) {
            if (listed(ja_hira_not_name, r->t, p, q)) return 0;
            *s = p, *e = q;
            return 1;
        }
        q += l, ++*r->steps;
    }
    return 0;
}

/* Hangul syllables from p, at most max: where they end */
static size_t hangul_forward(const reader *r, size_t p, int max, int *n)
{
    size_t l;
    *n = 0;
    while (*n < max && p < r->len && is_hangul(cp_at(r->t, r->len, p, &l))) p += l, ++*n, ++*r->steps;
    return p;
}

/* a Korean name that starts with a surname, k syllables long from s (3 bytes each) */
static int ko_surname_first(const reader *r, size_t s, int k, int max)
{
    if (k >= 2 && k <= max + 1 && listed(ko_surnames2, r->t, s, s + 6)) return 1;
    return k <= max && listed(ko_surnames, r->t, s, s + 3);
}

/* 이름은 X: the word after, less its copula or particle */
static int ko_after(const reader *r, size_t p, size_t *s, size_t *e)
{
    p = skip_gap(r, p);
    int n;
    size_t q = hangul_forward(r, p, 8, &n);
    if (n == 0 || (q < r->len && n == 8)) return 0;
    size_t end = q;
    int stripped = 0;
    for (size_t i = 0; i < sizeof ko_suffixes / sizeof ko_suffixes[0] && !stripped; i++) {
        size_t sl = strlen(ko_suffixes[i]);
        if (q - p > sl && memcmp(r->t + q - sl, ko_suffixes[i], sl) == 0) end = q - sl, stripped = 1;
    }
    int syl = (int)((end - p) / 3); /* every Hangul syllable is three bytes */
    if (syl < 2 || syl > 4 || listed(ko_not_name, r->t, p, end)) return 0;
    /* 이름은 없습니다, 이름은 모릅니다: a verb's ending, no name */
    if (!stripped && (listed(" 다 요 까 죠 ", r->t, end - 3, end))) return 0;
    *s = p, *e = end;
    return 1;
}

/* X씨, X 씨, X님: the word before, its surname first */
static int ko_before(const reader *r, size_t hs, int nim, size_t *s)
{
    size_t e = hs, b;
    if (e > 0 && cp_prev(r, e) == ' ') e--; /* 김민준 씨 */
    size_t start = e;
    int k = 0;
    while (k < 6 && start > 0 && is_hangul(cp_before(r->t, start, &b))) start = b, k++, ++*r->steps;
    if (k == 0 || k == 6) return 0;
    if (nim ? (k != 3 && !(k == 4 && listed(ko_surnames2, r->t, start, start + 6))) || listed(ko_not_nim, r->t, start, e)
            : !ko_surname_first(r, start, k, 3) || listed(ko_not_ssi, r->t, start, e))
        return 0;
    if (nim && !ko_surname_first(r, start, k, 3)) return 0;
    *s = start;
    return 1;
}

/* a word of script sc at p: its end (p if none, or longer than MAX_CHARS) */
static size_t word_at(const reader *r, size_t p, int sc)
{
    size_t q = p, l;
    int n = 0;
    while (q < r->len) {
        uint32_t c = cp_at(r->t, r->len, q, &l);
        /* a hyphen inside a Russian name (Петров-Водкин) */
        if (c == '-' && sc == SC_CYRILLIC && q > p && q + 1 < r->len && in_script(cp_next(r, q + 1), sc)) {
            q += l;
            continue;
        }
        if (!in_script(c, sc)) break;
        if (++n > MAX_CHARS) return p;
        q += l, ++*r->steps;
    }
    return q;
}

/* after the word ending at q, the next word's start when only spaces lie between (0 if none) */
static size_t next_word(const reader *r, size_t q, int sc)
{
    size_t l, p = q;
    int k = 0;
    while (p < r->len && k < 3 && is_space(cp_at(r->t, r->len, p, &l))) p += l, k++;
    return p > q && p < r->len && in_script(cp_next(r, p), sc) ? p : 0;
}

/* whether a cue of script sc at [s, e) stands as a word of its own */
static int whole(const reader *r, size_t s, size_t e, int sc)
{
    if (e < r->len && in_script(cp_next(r, e), sc)) return 0;
    if (s == 0 || !in_script(cp_prev(r, s), sc)) return 1;
    /* Arabic: وَ / فَ / بِ / لِ written onto the next word (والسيد أحمد) */
    size_t b, b2;
    uint32_t c = cp_before(r->t, s, &b);
    return sc == SC_ARABIC && (c == 0x0648 || c == 0x0641 || c == 0x0628 || c == 0x0644) &&
           (b == 0 || !in_script(cp_before(r->t, b, &b2), sc));
}

/* Arabic: up to three words after a cue -- the first; a second not
 * starting with و ("and", وأسكن "and I live"); a third only after a
 * joining word or with the article (أحمد بن علي, محمد عبد الخطيب) */
static int ar_after(const reader *r, size_t p, int hon, size_t *s, size_t *e)
{
    p = skip_gap(r, p);
    size_t q = word_at(r, p, SC_ARABIC);
    /* اسمي هو أحمد; السيد الرئيس محمد: the copula, or titles, before the name */
    for (int k = 0; k < 2 && q > p && (hon ? listed(ar_titles, r->t, p, q) : listed(" هو هي ", r->t, p, q)); k++) {
        size_t n = next_word(r, q, SC_ARABIC);
        if (!n) return 0;
        p = n, q = word_at(r, p, SC_ARABIC);
    }
    if (q == p || listed(ar_stop, r->t, p, q) || listed(ar_titles, r->t, p, q)) return 0;
    *s = p, *e = q;
    int join = listed(ar_joins, r->t, p, q);
    for (int w = 2; w <= 3; w++) {
        size_t a = next_word(r, *e, SC_ARABIC), b;
        if (!a || (b = word_at(r, a, SC_ARABIC)) == a || listed(ar_stop, r->t, a, b) || listed(ar_titles, r->t, a, b)) break;
        if (cp_next(r, a) == 0x0648) break; /* و */
        int article = b - a > 4 && memcmp(r->t + a, "\xd8\xa7\xd9\x84", 4) == 0; /* ال */
        if (w == 3 && !join && !article) break;
        join = listed(ar_joins, r->t, a, b);
        *e = b;
    }
    return 1;
}

/* Hindi: up to max words after a cue, none of hi_stop (मेरा नाम है राहुल: the copula first is skipped) */
static int hi_after(const reader *r, size_t p, int max, size_t *s, size_t *e)
{
    if (p < r->len && r->t[p] == '.') p++; /* डॉ. */
    p = skip_gap(r, p);
    size_t q = word_at(r, p, SC_DEVANAGARI);
    if (q > p && listed(" है ", r->t, p, q)) {
        size_t n = next_word(r, q, SC_DEVANAGARI);
        if (!n) return 0;
        p = n, q = word_at(r, p, SC_DEVANAGARI);
    }
    if (q == p || listed(hi_stop, r->t, p, q)) return 0;
    *s = p, *e = q;
    for (int w = 2; w <= max; w++) {
        size_t a = next_word(r, *e, SC_DEVANAGARI), b;
        if (!a || (b = word_at(r, a, SC_DEVANAGARI)) == a || listed(hi_stop, r->t, a, b)) break;
        *e = b;
    }
    return 1;
}

/* the Devanagari word ending at e (after at most one space): its start, or e */
static size_t deva_word_back(const reader *r, size_t e)
{
    size_t b, s = e;
    int n = 0;
    while (s > 0 && n <= MAX_CHARS && in_script(cp_before(r->t, s, &b), SC_DEVANAGARI)) s = b, n++, ++*r->steps;
    return n > MAX_CHARS ? e : s;
}

/* X जी: one or two words before, none of hi_stop or the family words */
static int hi_before(const reader *r, size_t hs, size_t *s)
{
    if (hs == 0 || cp_prev(r, hs) != ' ') return 0;
    size_t e = hs - 1, a = deva_word_back(r, e);
    if (a == e || listed(hi_stop, r->t, a, e) || listed(hi_not_ji, r->t, a, e)) return 0;
    *s = a;
    if (a > 0 && cp_prev(r, a) == ' ') {
        size_t a2 = deva_word_back(r, a - 1);
        if (a2 < a - 1 && !listed(hi_stop, r->t, a2, a - 1) && !listed(hi_not_ji, r->t, a2, a - 1)) *s = a2;
    }
    return 1;
}

static int is_upper(uint32_t c) { return utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_LU; }

/* Russian: capitalised words after a cue (up to three), or, when lower is
 * set, lowercase ones (up to two) that are no function words */
static int ru_after(const reader *r, size_t p, int lower, size_t *s, size_t *e)
{
    p = skip_gap(r, p);
    size_t q = word_at(r, p, SC_CYRILLIC);
    if (q == p) return 0;
    int cap = is_upper(cp_next(r, p));
    if (!cap && (!lower || listed(ru_stop, r->t, p, q))) return 0;
    *s = p, *e = q;
    for (int w = 2; w <= (cap ? 3 : 2); w++) {
        size_t a = next_word(r, *e, SC_CYRILLIC), b;
        if (!a || (b = word_at(r, a, SC_CYRILLIC)) == a || is_upper(cp_next(r, a)) != cap || listed(ru_stop, r->t, a, b)) break;
        *e = b;
    }
    return 1;
}

/* the name cue c at [cs, ce) points at, as [*s, *e) */
static int name_of(const reader *r, const cue *c, size_t cs, size_t ce, size_t *s, size_t *e)
{
    switch (c->kind) {
    case ZH_CALL: return zh_after(r, ce, 0, s, e);
    case ZH_NAME: return zh_after(r, ce, 1, s, e);
    case ZH_HON:
    case ZH_JA_HON:
        *e = cs;
        /* 山田先生に: Japanese, kana next to it -- a name of kanji, its
         * surname no Chinese one (山 is not; 田 is, and would leave 山 out) */
        if (c->kind == ZH_JA_HON && (is_kana(cp_next(r, ce)) || is_kana(cp_prev(r, ja_back(r, cs, 6)))))
            return ja_before(r, cs, s);
        return zh_before(r, cs, s);
    case JA_NAME: return ja_after(r, ce, s, e);
    case JA_MOSU: *e = cs, *s = ja_back(r, cs, 8); return *s < cs;
    case JA_HON: *e = cs; return ja_before(r, cs, s);
    case JA_HON_HAN:
        /* 様子, 氏名, 君主: the start of a longer word; 君 / 氏 / 殿 are Chinese words too, so kana must be near */
        *e = cs;
        if (is_han(cp_next(r, ce)) || (!is_kana(cp_next(r, ce)) && !is_kana(cp_prev(r, ja_back(r, cs, 6))) &&
                                       strcmp(c->s, "様") != 0))
            return 0;
        return ja_before(r, cs, s);
    case KO_NAME: return ko_after(r, ce, s, e);
    case KO_SSI:
    case KO_NIM: *e = cs > 0 && cp_prev(r, cs) == ' ' ? cs - 1 : cs; return ko_before(r, cs, c->kind == KO_NIM, s);
    case AR_NAME:
    case AR_HON: return whole(r, cs, ce, SC_ARABIC) && ar_after(r, ce, c->kind == AR_HON, s, e);
    case HI_NAME: return whole(r, cs, ce, SC_DEVANAGARI) && hi_after(r, ce, 3, s, e);
    case HI_HON: return whole(r, cs, ce, SC_DEVANAGARI) && hi_after(r, ce, 2, s, e);
    case HI_JI: *e = cs - (cs > 0); return whole(r, cs, ce, SC_DEVANAGARI) && hi_before(r, cs, s);
    case RU_NAME: return whole(r, cs, ce, SC_CYRILLIC) && ru_after(r, ce, 1, s, e);
    case RU_IAM: return whole(r, cs, cs + 2, SC_CYRILLIC) && ru_after(r, ce, 0, s, e);
    }
    return 0;
}

cp_status cp_names_pass_scripts(const char *t, size_t len, cp_spans *out, uint64_t *steps, cp_error *err)
{
    const reader r = { t, len, steps };
    for (size_t i = 0; i < len; i++) {
        ++*steps;
        const unsigned char b = (unsigned char)t[i];
        if (b < 0xC0) continue; /* every cue starts with a non-ASCII character */
        for (size_t k = 0; k < N_CUES; k++) {
            const cue *c = &cues[k];
            size_t n = strlen(c->s), s, e;
            if ((unsigned char)c->s[0] != b || len - i < n || memcmp(t + i, c->s, n) != 0) continue;
            ++*steps;
            if (!name_of(&r, c, i, i + n, &s, &e) || e <= s) continue;
            cp_status rc = cp_spans_add(out, (uint32_t)s, (uint32_t)e, "person", 0.7f, err);
            if (rc) return rc;
            break;
        }
    }
    return CP_OK;
}
