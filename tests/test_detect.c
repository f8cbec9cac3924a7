/* The detector: each recognizer with positives and near-miss negatives,
 * fail-closed behaviour of every kind of failure, rule files, plugins, the
 * per-role policy, <pii> markers and the span -> token mask. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/detect/detect.h"
#include "helpers.h"

static cp_detect_chain builtin_chain(void) { return test_chain_of(cp_detector_builtin); }

/* the types found in text, as "type:matched text;..." */
static void found(cp_detect_chain *c, const char *text, char *out, size_t cap) { test_spans_text(c, text, NULL, out, cap); }

/* a message and the spans the chain must find in it ("type:text;" each) */
typedef struct found_case {
    const char *text, *want;
} found_case;

/* each case finds exactly its spans */
static void expect_found(cp_detect_chain *c, const found_case *cases, size_t n)
{
    char got[1024];
    for (size_t i = 0; i < n; i++) {
        found(c, cases[i].text, got, sizeof got);
        cr_assert_str_eq(got, cases[i].want, "case %zu '%s': got '%s'", i, cases[i].text, got);
    }
}

/* each near miss stays unmarked */
static void expect_none(cp_detect_chain *c, const char *const *negatives, size_t n)
{
    char got[1024];
    for (size_t i = 0; i < n; i++) {
        found(c, negatives[i], got, sizeof got);
        cr_assert_str_eq(got, "", "near miss %zu '%s' was flagged: %s", i, negatives[i], got);
    }
}

Test(detect, recognizers_find_positives)
{
    cp_detect_chain c = builtin_chain();
    static const found_case cases[] = {
        { "mail jane.doe+x@example.co.uk now", "email:jane.doe+x@example.co.uk;" },
        { "call +1 (415) 555-0132 today", "phone:+1 (415) 555-0132;" },
        { "or 07700 063 966.", "phone:07700 063 966;" },
        { "pay with 4111-1111-1111-1111 please", "card:4111-1111-1111-1111;" },
        { "my card 630427373398 is lost", "card:630427373398;" },
        { "IBAN GB82 WEST 1234 5698 7654 32 ok", "iban:GB82 WEST 1234 5698 7654 32;" },
        { "iban gb82west12345698765432", "iban:gb82west12345698765432;" },
        { "SSN 123-45-6789.", "ssn:123-45-6789;" },
        { "host 192.168.0.1 and", "ip:192.168.0.1;" },
        { "v6 2001:db8::8a2e:370:7334 end", "ip:2001:db8::8a2e:370:7334;" },
        { "DOB: 1984-03-07, thanks", "dob:1984-03-07;" },
        { "she was born on 2 March 1990.", "dob:2 March 1990;" },
        { "I live at 221 Baker Street, Apt 4B now", "address:221 Baker Street, Apt 4B;" },
        { "key AKIAIOSFODNN7EXAMPLE here", "secret:AKIAIOSFODNN7EXAMPLE;" },
        { "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
          "secret:eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U;" },
        { "password: hunter22", "secret:hunter22;" },
        { "api_key=Zx9qL2mVt8RkP4wN", "secret:Zx9qL2mVt8RkP4wN;" },
        /* keys named by identifiers that hold the word (environment variables, config keys) */
        { "DB_PASSWORD=hunter2", "secret:hunter2;" },
        { "OPENAI_API_KEY=sk-proj-Ab3dE5gH7jK9mN1pQ3sT5vX7zB9", "secret:sk-proj-Ab3dE5gH7jK9mN1pQ3sT5vX7zB9;" },
        { "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "secret:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY;" },
        { "GITHUB_TOKEN=abcd1234efgh5678ijkl", "secret:abcd1234efgh5678ijkl;" },
        { "export STRIPE_SECRET_KEY=\"sk_live_4eC39HqLyjWDarjtT1zdp7dc\"", "secret:sk_live_4eC39HqLyjWDarjtT1zdp7dc;" },
        /* providers' keys by prefix, in prose */
        { "Our key is sk_live_4eC39HqLyjWDarjtT1zdp7dc ok", "secret:sk_live_4eC39HqLyjWDarjtT1zdp7dc;" },
        { "use xoxb-1234567890-abcdefghij now", "secret:xoxb-1234567890-abcdefghij;" },
        /* secrets named in prose */
        { "My password is hunter2correcthorse.", "secret:hunter2correcthorse;" },
        { "The vault code is purple-falcon-7731.", "secret:purple-falcon-7731;" },
        { "my wifi password is \"Tr0ub4dor&3\"", "secret:Tr0ub4dor&3;" },
        { "I was diagnosed with HIV last week.", "health:was diagnosed with HIV;" },
        /* headers, tools, files and markup that carry a credential */
        { "Authorization: Bearer q8Zr2LmX7vKp4TnWa1b2c3d4", "secret:q8Zr2LmX7vKp4TnWa1b2c3d4;" },
        { "AUTH=Basic YWxpY2U6aHVudGVyMg==", "secret:YWxpY2U6aHVudGVyMg==;" },
        { "Set-Cookie: sid=q8Zr2LmX7vKp4TnW; HttpOnly", "secret:sid=q8Zr2LmX7vKp4TnW; HttpOnly;" },
        { "curl -u admin:hunter2correct https://x.example", "secret:admin:hunter2correct;" },
        { "redis://:hunter2correct@cache.internal:6379/0", "url_credentials:redis://:hunter2correct@cache.internal:6379;" },
        { "//registry.npmjs.org/:_authToken=a1b2c3d4-e5f6-7890-abcd-ef1234567890", "secret:a1b2c3d4-e5f6-7890-abcd-ef1234567890;" },
        { "password => hunter2correct", "secret:hunter2correct;" },
        { "**Password:** hunter2correct", "secret:hunter2correct;" },
        { "<password>hunter2correct</password>", "secret:hunter2correct;" },
        { "API key: q8Zr2LmX7vKp4TnWa1b2c3d4", "secret:q8Zr2LmX7vKp4TnWa1b2c3d4;" },
        { "twilio SK0123456789abcdef0123456789abcdef", "secret:SK0123456789abcdef0123456789abcdef;" },
        { "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF2x\n-----END PGP PRIVATE KEY BLOCK-----",
          "secret:-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF2x\n-----END PGP PRIVATE KEY BLOCK-----;" },
        /* prose: other phrasings and languages, a passphrase of several words, recovery material */
        { "The password for the router is hunter2correct.", "secret:hunter2correct;" },
        { "My password is correct horse battery staple", "secret:correct horse battery staple;" },
        { "Mein Passwort ist hunter2correct", "secret:hunter2correct;" },
        { "username admin, password hunter2correct", "secret:hunter2correct;" },
        { "my mother's maiden name is Kowalczyk", "secret:Kowalczyk;" },
        { "Backup codes: 8f3k-29dj 4kd9-xq2m", "secret:8f3k-29dj 4kd9-xq2m;" },
        /* command lines, a Wi-Fi line, tables whose header names the column, invisible characters */
        { "mysql -u root -pS3cretPass db", "secret:S3cretPass;" },
        { "sshpass -p hunter2x ssh host", "secret:hunter2x;" },
        { "WiFi: HomeNet / key Sunfl0wer2024", "secret:Sunfl0wer2024;" },
        { "SSID HomeNet, password bluebird", "secret:bluebird;" },
        { "WiFi HomeNet key: bluebird", "secret:bluebird;" },
        { "user,password\nalice,hunter2x\nbob,Tr0ub4dor", "secret:hunter2x;secret:Tr0ub4dor;" },
        { "| user | API key |\n|:---|---:|\n| bob | q8Zr2LmX7vKp |", "secret:q8Zr2LmX7vKp;" },
        { "name;pin\nann;4821", "secret:4821;" },
        { "id\tdbPassword\n7\t\"s3cr,et\"", "secret:s3cr,et;" },
        { "password,hunter2correct", "secret:hunter2correct;" },
        { "Password;correct horse battery staple", "secret:correct horse battery staple;" },
        { "host,rootpassword\ndb1,Zq9xLm2024", "secret:Zq9xLm2024;" },
        /* other clients' password flags, each on its client's line */
        { "PGPASSWORD=Sunfl0wer2024 psql -h db", "secret:Sunfl0wer2024;" },
        { "redis-cli -h r -a Sunfl0wer2024 ping", "secret:Sunfl0wer2024;" },
        { "mongo -u admin -p Sunfl0wer2024 db", "secret:Sunfl0wer2024;" },
        { "htpasswd -b .htpasswd admin Sunfl0wer2024", "secret:Sunfl0wer2024;" },
        { "openssl enc -aes256 -k Sunfl0wer2024 -in a", "secret:Sunfl0wer2024;" },
        { "openssl rsa -passin pass:Sunfl0wer2024 -in k", "secret:Sunfl0wer2024;" },
        { "ldapsearch -x -D cn=admin -w Sunfl0wer2024 -b dc=x", "secret:Sunfl0wer2024;" },
        { "sqlcmd -S db -U sa -P Sunfl0wer2024", "secret:Sunfl0wer2024;" },
        { "xfreerdp /v:host /u:admin /p:Sunfl0wer2024", "secret:Sunfl0wer2024;" },
        { "mongosh --password hunter", "secret:hunter;" },
        { "docker login -u deploy -p bluebird registry.x", "secret:bluebird;" },
        { "machine api.x.com login bob password hunter", "secret:hunter;" },
        /* words and codes after a secret's name */
        { "the secret word is bluebird", "secret:bluebird;" },
        { "login for the router: admin / bluebird7", "secret:admin / bluebird7;" },
        { "api_key=Lightning1991", "secret:Lightning1991;" },
        { "token=48213377", "secret:48213377;" },
        { "api_key=bluebird", "secret:bluebird;" },
        { "auth: 4821337", "secret:4821337;" },
        { "WiFi: HomeNet / key bluebirds", "secret:bluebirds;" },
        { "SSID HomeNet, password misuses", "secret:misuses;" },
        { "secret: bluebird", "secret:bluebird;" },
        { "pass\xe2\x80\x8bword: hunter22", "secret:hunter22;" },
        /* fullwidth forms: "ｐａｓｓｗｏｒｄ：ｈｕｎｔｅｒ２２" */
        { "\xef\xbd\x90\xef\xbd\x81\xef\xbd\x93\xef\xbd\x93\xef\xbd\x97\xef\xbd\x8f\xef\xbd\x92\xef\xbd\x84\xef\xbc\x9a"
          "\xef\xbd\x88\xef\xbd\x95\xef\xbd\x8e\xef\xbd\x94\xef\xbd\x85\xef\xbd\x92\xef\xbc\x92\xef\xbc\x92",
          "secret:\xef\xbd\x88\xef\xbd\x95\xef\xbd\x8e\xef\xbd\x94\xef\xbd\x85\xef\xbd\x92\xef\xbc\x92\xef\xbc\x92;" },
        { "my pass\xc2\xadword is hun\xe2\x80\x8cter2x!", "secret:hun\xe2\x80\x8cter2x;" },
        /* numbers in other shapes */
        { "My card is 4111.1111.1111.1111.", "card:4111.1111.1111.1111;" },
        { "card 4111 1111-1111 1111 ok", "card:4111 1111-1111 1111;" },
        /* grouped with a no-break, narrow no-break or thin space, an en dash, a minus sign */
        { "card 4111\xc2\xa0" "1111\xc2\xa0" "1111\xc2\xa0" "1111 ok", "card:4111\xc2\xa0" "1111\xc2\xa0" "1111\xc2\xa0" "1111;" },
        { "card 4111\xe2\x80\xaf" "1111\xe2\x80\xaf" "1111\xe2\x80\xaf" "1111 ok", "card:4111\xe2\x80\xaf" "1111\xe2\x80\xaf" "1111\xe2\x80\xaf" "1111;" },
        { "card 4111\xe2\x80\x89" "1111\xe2\x80\x89" "1111\xe2\x80\x89" "1111 ok", "card:4111\xe2\x80\x89" "1111\xe2\x80\x89" "1111\xe2\x80\x89" "1111;" },
        { "card 4111\xe2\x80\x93" "1111\xe2\x80\x93" "1111\xe2\x80\x93" "1111 ok", "card:4111\xe2\x80\x93" "1111\xe2\x80\x93" "1111\xe2\x80\x93" "1111;" },
        { "ssn 078\xe2\x88\x92" "05\xe2\x88\x92" "1120 ok", "ssn:078\xe2\x88\x92" "05\xe2\x88\x92" "1120;" },
        { "cvv 123", "card:123;" },
        { "my social is 078051120", "ssn:078051120;" },
        /* health: a condition named, with the words before it */
        { "I'm eleven weeks pregnant.", "health:I'm eleven weeks pregnant;" },
        { "I have HIV.", "health:I have HIV;" },
        { "He was treated for type 2 diabetes in 2019.", "health:for type 2 diabetes;" },
        { "fetch https://bob:s3cr3t@db.internal/x", "url_credentials:https://bob:s3cr3t@db.internal;" },
        { "Hello, my name is Anna Kowalska.", "person:Anna Kowalska;" },
        { "Please ask Dr. Cettina Fanucci", "person:Cettina Fanucci;" },
        { "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
          "secret:-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----;" },
    };
    expect_found(&c, cases, sizeof cases / sizeof cases[0]);
    cp_chain_free(&c);
}

/* Formats an attack on a running server found shared (the value's KV, and
 * what follows it, reused by another tenant who guessed the value): each
 * is marked now, and the near misses beside them are not. */
Test(detect, config_lines_ids_and_prose_in_other_languages)
{
    cp_detect_chain c = builtin_chain();
    static const found_case cases[] = {
        /* code and config */
        { "variable \"db_password\" {\n  default = \"Tr0ub4dorX3x\"\n}", "secret:Tr0ub4dorX3x;" },
        { "<input type=\"password\" name=\"pw\" value=\"Tr0ub4dorX3x\">", "secret:Tr0ub4dorX3x;" },
        { "<input value=\"8f3a9c2e7b1d4f6a0c5e\" type=\"hidden\" name=\"csrf_token\">", "secret:8f3a9c2e7b1d4f6a0c5e;" },
        { "const apiSecret = \"Tr0ub4dorX3x\";", "secret:Tr0ub4dorX3x;" },
        { "const stripeKey = \"rk8f3a9c2e7b1d4f6a0c5e\";", "secret:rk8f3a9c2e7b1d4f6a0c5e;" },
        { "const stripeKey = \"bananas\";", "secret:bananas;" }, /* a key named key takes any value: the hump ends its last part */
        { "db01.internal:5432:sales:app:Tr0ub4dorX3x", "secret:Tr0ub4dorX3x;" },
        { "using ~/.pgpass line *:*:*:postgres:tr0ub4dorx3x now", "secret:tr0ub4dorx3x;" },
        { "admin:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/", "secret:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/;" },
        { "root:$6$saltsalt$9f8e7d6c5b4a3f2e1d0c:19000:0:99999:7:::", "secret:$6$saltsalt$9f8e7d6c5b4a3f2e1d0c;" },
        { "GET /cart;jsessionid=A8F3C29E7B1D4F6A0C5E 200", "secret:A8F3C29E7B1D4F6A0C5E;" },
        { "https://portal.example.com/home?sid=a8f3c29e7b1d4f6a0c5e", "secret:a8f3c29e7b1d4f6a0c5e;" },
        { "Windows product key: VK7JG-NPHTM-C97JM-9MPGT-3V66T", "secret:VK7JG-NPHTM-C97JM-9MPGT-3V66T;" },
        /* prose */
        { "my sess" "ion id is a8f3c29e7b1d4f6a0c5e", "secret:a8f3c29e7b1d4f6a0c5e;" }, /* split: the history-word check */
        { "My 2FA seed is JBSWY3DPEHPK3PXP.", "secret:JBSWY3DPEHPK3PXP;" },
        { "OTP 481726", "secret:481726;" },
        { "my api key is 8f3a9c2e7b1d4f6a0c5e9d", "secret:8f3a9c2e7b1d4f6a0c5e9d;" },
        { "the secret is tr0ub4dorx3x", "secret:tr0ub4dorx3x;" },
        { "the license key for the app is ABCD-EFGH-IJKL-MNOP", "secret:ABCD-EFGH-IJKL-MNOP;" },
        { "security question: first pet? answer: rustybones", "secret:rustybones;" },
        { "Mein Passwort lautet Tr0ub4dorX3x.", "secret:Tr0ub4dorX3x;" },
        { "La clave del wifi de la oficina es tr0ub4dorx3x.", "secret:tr0ub4dorx3x;" },
        { "Le code secret de ma carte est 4817.", "secret:4817;" },
        { "Minha senha \xc3\xa9 tr0ub4dorx3x.", "secret:tr0ub4dorx3x;" },
        { "La mia password \xc3\xa8 Tr0ub4dorX3x.", "secret:Tr0ub4dorX3x;" },
        { "\xd0\x9c\xd0\xbe\xd0\xb9 \xd0\xbf\xd0\xb0\xd1\x80\xd0\xbe\xd0\xbb\xd1\x8c Tr0ub4dorX3x, ok", "secret:Tr0ub4dorX3x;" },
        { "\xe6\x88\x91\xe7\x9a\x84\xe5\xaf\x86\xe7\xa0\x81\xe6\x98\xaftr0ub4dorx3x\xef\xbc\x8c", "secret:tr0ub4dorx3x;" },
        { "\xe3\x83\x91\xe3\x82\xb9\xe3\x83\xaf\xe3\x83\xbc\xe3\x83\x89\xe3\x81\xaftr0ub4dorx3x\xe3\x80\x82", "secret:tr0ub4dorx3x;" },
        { "\xeb\xb9\x84\xeb\xb0\x80\xeb\xb2\x88\xed\x98\xb8\xeb\x8a\x94 tr0ub4dorx3x.", "secret:tr0ub4dorx3x;" },
        /* identity documents and accounts by their names */
        { "Passport No: X12345678", "id:X12345678;" },
        { "Reisepassnummer: C01X00T47", "id:C01X00T47;" },
        { "my driver licence number is D1234567", "id:D1234567;" },
        { "DNI: 12345678Z", "id:12345678Z;" },
        { "National Insurance number: QQ123456C", "id:QQ123456C;" },
        { "Aadhaar: 2345 6789 0123", "id:2345 6789 0123;" },
        { "Her MRN is 00482913 at the clinic.", "id:00482913;" },
        { "Wire to routing 021000021, account 000123456789", "id:021000021;id:000123456789;" },
        { "Send it to my wallet bc1qxy2kgdygjrsqtzq2n0yrf2493p83kkfjhx0wlh today.", "crypto:bc1qxy2kgdygjrsqtzq2n0yrf2493p83kkfjhx0wlh;" },
        { "born on the 14th of March 1962", "dob:the 14th of March 1962;" },
    };
    expect_found(&c, cases, sizeof cases / sizeof cases[0]);
    static const char *const negatives[] = {
        "The secret is out.",
        "the secret is to keep going",
        "check your account settings",
        "my account is 5 years old",
        "on account of 1850 acres",
        "bring a passport photo",
        "v6 fe80:0:0:0:abcd here",            /* five colon groups: an IPv6 address, not a .pgpass line */
        "it costs $1 and $5 each",            /* a dollar sign, not a crypt hash */
        "const orderId = \"a8f3c29e7b1d4f6a0c5e\";",
        "let passKey = \"x\";",                /* too short */
        "<input type=\"text\" name=\"q\" value=\"search\">",
        "the sess" "ion id is shown below",
        "the api key is required",
        "sid: 12",
        "member id A1B2C",                    /* two digits: a reference, not an ID number */
    };
    expect_none(&c, negatives, sizeof negatives / sizeof negatives[0]);
    cp_chain_free(&c);
}

/* What an attack on a running server found shared: keys no name announces,
 * device and tax identifiers, money, addresses written to dodge machines,
 * recovery words, dates of birth in other words and languages, card
 * details and postcodes after their names -- each marked, and the near
 * misses beside them (identifiers, prose, plain numbers) left alone. */
Test(detect, unnamed_keys_devices_money_and_dodged_addresses)
{
    cp_detect_chain c = builtin_chain();
    static const found_case cases[] = {
        /* tokens no one writes by hand, whatever names them */
        { "aws secret wJalr9UtnFEMI/K7MDENG/bPxRfiCYz3K8pQw2Lm ok", "secret:wJalr9UtnFEMI/K7MDENG/bPxRfiCYz3K8pQw2Lm;" },
        { "AZURE_STORAGE_KEY=q7L2mR8vXk3pN0sT5wY9bC4fH6jD1gZ8aE2uQ7iO3lK5nM0rS9tV4xC1vB==",
          "secret:q7L2mR8vXk3pN0sT5wY9bC4fH6jD1gZ8aE2uQ7iO3lK5nM0rS9tV4xC1vB==;" },
        { "TOTP JBSWY3DPEHPK3PXPQ7RZ", "secret:JBSWY3DPEHPK3PXPQ7RZ;" },
        { "twilio 9f2c4e8a1b7d3f6e0c5a9b2d8e4f1a3d", "secret:9f2c4e8a1b7d3f6e0c5a9b2d8e4f1a3d;" },
        /* devices, tax and identity numbers */
        { "my laptop's MAC is 3C:22:FB:9A:10:4E", "id:3C:22:FB:9A:10:4E;" },
        { "mac 3c-22-fb-9a-10-4e here", "id:3c-22-fb-9a-10-4e;" },
        { "ITIN: 912-78-1234", "ssn:912-78-1234;" },
        { "my national insurance number is JG 10 37 29 D", "id:JG 10 37 29 D;" },
        { "my passport number is AB 1234567 for the visa", "id:AB 1234567;" }, /* capitals and a space, then the digits */
        { "my medicare number is 1EG4-TE5-MK73", "id:1EG4-TE5-MK73;" },
        { "Personalausweis-Nr. L01X00T47", "id:L01X00T47;" },
        { "VIN 1HGCM82633A004352", "id:1HGCM82633A004352;" },
        { "SWIFT/BIC DEUTDEFF500", "id:DEUTDEFF500;" },
        /* money a person earns, owns or owes */
        { "my salary is $87,500 a year", "money:$87,500;" },
        { "Mein Kontostand: \xe2\x82\xac" "12.340,55", "money:\xe2\x82\xac" "12.340,55;" },
        { "I make $87,500 a year", "money:$87,500;" },
        { "we owe 4000 dollars on the car", "money:4000 dollars;" },
        /* addresses written to dodge machines */
        { "contact jdoe [at] example [dot] org for details", "email:jdoe [at] example [dot] org;" },
        { "my mail is priya_r at yahoo dot co dot in", "email:priya_r at yahoo dot co dot in;" },
        { "Kontakt: m.kowalski(at)firma.pl", "email:m.kowalski(at)firma.pl;" },
        { "email: dana.whitlock at protonmail.com", "email:dana.whitlock at protonmail.com;" },
        /* recovery words, dates of birth, card details, postcodes */
        { "recovery words: ocean grief shine abstract lunar", "secret:ocean grief shine abstract lunar;" },
        { "seed: ocean grief shine abstract lunar melody river stone cloud vivid amber quiet",
          "secret:ocean grief shine abstract lunar melody river stone cloud vivid amber quiet;" },
        { "The user's date of birth is 14 July 1990.", "dob:14 July 1990;" },
        { "je suis n\xc3\xa9 le 7 juin 1983", "dob:7 juin 1983;" },
        { "date of birth: 14-JUL-1990", "dob:14-JUL-1990;" },
        { "1990\xe5\xb9\xb4" "7\xe6\x9c\x88" "14\xe6\x97\xa5\xe7\x94\x9f\xe3\x81\xbe\xe3\x82\x8c", "dob:1990\xe5\xb9\xb4" "7\xe6\x9c\x88" "14\xe6\x97\xa5;" },
        { "the security code on the back is 482", "card:482;" },
        { "card expiry 09/28", "card:09/28;" },
        { "my postcode is SW1A 2AA", "address:SW1A 2AA;" },
    };
    expect_found(&c, cases, sizeof cases / sizeof cases[0]);
    static const char *const negatives[] = {
        "SHA256WithRSAEncryption is used",     /* an identifier: few class changes */
        "load Mistral-7B-Instruct-v0.3 now",
        "call getUserByIdFromDatabase2 first", /* its digits in one place */
        "new Utf8StringToUtf16Converter()",    /* mostly words */
        "BUILD2024release10FINALX",            /* few class changes */
        "version 1234.5678.9012 - build",      /* a dotted number, not a MAC */
        "My salary is fine. I paid $5 for coffee.", /* the cue in another sentence */
        "I will learn to earn. The power bill was $120.", /* 'owe' inside a word */
        "My power bill was $120 while learning.", /* 'owe' inside a word, with an owner */
        "id 123e4567-e89b-12d3-a456-426614174000",
        "IMG_20230714_153012.jpg",
        "x86_64-linux-gnu",
        "at 12:34:56 the train left",
        "MAC and cheese 12-34",
        "look at example.com for details",     /* a plain at without an address's marks */
        "meet me at 10.30 tomorrow",
        "I paid $5 for coffee",                /* money, but no cue that it is a person's */
        "the balance of power shifted in 1648",
        "I owe you one",
        "learn 500 words",
        "the seed is planted in spring",
        "born in 1990",
        "it expires in 2 days",
        "zip the file and send it",
        "account for 1999 events",
        "the VIN is on the dashboard",
        "a template for 2024",
        "Offer valid until 12/25",             /* an expiry with no card on its line */
        "SWIFT MESSAGES are queued",           /* a word after the name, no code marker */
        "seed: 42 for reproducibility",        /* a random seed, not twelve words */
        "mail it: inbox at gmail.com",         /* a plain at: no address's marks */
        "python 3.12 at python.org",           /* a version at a site */
        "income grew 18% to $1.1M",            /* no one's money */
        "a barista earns about $15.50 an hour",
        "bytes 4a:6f:68:6e:20:44 in the dump",  /* a hexdump, no network word */
        "sync AA-55-AA-55-AA-55 then data",
        "commit 9fceb02d0ae598e95dc970b74767f19372d61af8", /* a digest named as one */
        "sha256:9b1c0f5e8d7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c",
    };
    expect_none(&c, negatives, sizeof negatives / sizeof negatives[0]);
    cp_chain_free(&c);
}

/* What an outside audit of held-out messages found missed: wallet
 * addresses, recovery words as a numbered list, passwords set in words,
 * national and bank identifiers by their names and checksums, plates,
 * encoded and spelt-out addresses, phones between kana, hanzi and after
 * their names, bare MACs, coordinates, dates of birth, health, money --
 * each marked whole, and beside each its near misses (a checksum one
 * off, the name missing, a shape one character off), left alone. */
Test(detect, audit_held_out_misses_and_their_near_misses)
{
    cp_detect_chain c = builtin_chain();
    static const found_case cases[] = {
        /* crypto and keys */
        { "ETH wallet 0x9ba0719fbee1df35e7f710271130818c4e7e6b27 \xe2\x80\x94 send USDC there",
          "crypto:0x9ba0719fbee1df35e7f710271130818c4e7e6b27;" },
        { "{\"withdraw_to\":\"0x2d1302e2d076310e82c4d3932281e7170cbee5c8\",\"amount\":\"0.42\"}",
          "crypto:0x2d1302e2d076310e82c4d3932281e7170cbee5c8;" },
        { "1. orbit 2. siren 3. garlic 4. frost 5. pilot 6. umbrella 7. ripple 8. canyon 9. lizard 10. tumble 11. oxygen 12. harvest",
          "secret:1. orbit 2. siren 3. garlic 4. frost 5. pilot 6. umbrella 7. ripple 8. canyon 9. lizard 10. tumble 11. oxygen 12. harvest;" },
        { "Mot de passe : Gr3nouille_Bleue!", "secret:Gr3nouille_Bleue!;" },
        { "admin/admin didn't work, so I set it to Velvet$Orca88", "secret:Velvet$Orca88;" },
        { "webhook https://hooks.slack.com/services/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",
          "secret:https://hooks.slack.com/services/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;" },
        /* national and bank identifiers after their names */
        { "NI no. AB837261C", "id:AB837261C;" },
        { "my nino is ks 62 03 91 d", "id:ks 62 03 91 d;" },
        { "National Insurance number: QQ 12 34 56 C... no sorry, it's JT 48 19 72 B", "id:QQ 12 34 56 C;id:JT 48 19 72 B;" },
        { "UID 6820-5917-3424", "id:6820-5917-3424;" },
        { "PAN card: BNZPM4821K", "id:BNZPM4821K;" },
        { "my pan is akrps7319q", "id:akrps7319q;" },
        { "BSN: 271849307", "id:271849307;" },
        { "Codice fiscale: FRRLCU79E14L219B", "id:FRRLCU79E14L219B;" },
        { "il mio CF \xc3\xa8 bncgli91t52h501y", "id:bncgli91t52h501y;" },
        { "mi NIE es Y-3046217-L", "id:Y-3046217-L;" },
        { "Num\xc3\xa9ro de s\xc3\xa9" "cu : 2 85 07 75 123 456 55", "id:2 85 07 75 123 456 55;" },
        /* its key one off: no NIR (what is left is a phone's shape, as before) */
        { "Num\xc3\xa9ro de s\xc3\xa9" "cu : 2 85 07 75 123 456 56", "phone:2 85 07 75 123 456;" },
        { "Reisepass-Nr.: C7HKRJ2T9", "id:C7HKRJ2T9;" },
        { "{\"traveler\":{\"passport_number\":\"K71304928\"}}", "id:K71304928;" },
        { "DL# S530-4127-8891 (Illinois)", "id:S530-4127-8891;" },
        { "F\xc3\xbchrerscheinnummer J4108XK7L21", "id:J4108XK7L21;" },
        { "UK driving licence WHITC812059RJ9KT", "id:WHITC812059RJ9KT;" },
        { "send the refund to IE91-BOFI-900017-48263915", "iban:IE91-BOFI-900017-48263915;" },
        { "ABA: 322070475, acct #: 7731902248", "id:322070475;id:7731902248;" },
        /* contact */
        { "GET /unsubscribe?email=mira.holt%40gmail.com HTTP/1.1", "email:mira.holt%40gmail.com;" },
        { "reach me at m dot okafor at hey dot com", "email:m dot okafor at hey dot com;" },
        { "my address is dana underscore k at proton dot me", "email:dana underscore k at proton dot me;" },
        { "Mein Handy: 0151 4872 0936", "phone:0151 4872 0936;" },
        { "\xe6\x90\xba\xe5\xb8\xaf\xe3\x81\xaf" "090-4821-7736\xe3\x81\xa7\xe3\x81\x99\xe3\x80\x82", "phone:090-4821-7736;" },
        { "\xe6\x89\x8b\xe6\x9c\xba\xe5\x8f\xb7\xe7\xa0\x81\xef\xbc\x9a" "138 2746 9150", "phone:138 2746 9150;" },
        { "<a href=\"tel:+13106294417\">Call Dana</a>", "phone:+13106294417;" },
        { "hw addr b827eb4c19d2", "id:b827eb4c19d2;" },
        { "MAC a0b3.cc41.7e92 on the switch port", "id:a0b3.cc41.7e92;" },
        { "My house is at 47.6205, -122.3493 if the driver gets lost.", "location:47.6205, -122.3493;" },
        { "we live right here: 35\xc2\xb0" "41'22.2\"N 139\xc2\xb0" "41'30.1\"E", "location:35\xc2\xb0" "41'22.2\"N 139\xc2\xb0" "41'30.1\"E;" },
        { "https://maps.google.com/?q=-33.86882,151.20929 that's my place", "location:-33.86882,151.20929;" },
        /* dates of birth, health, records, vehicles, money */
        { "fecha de nacimiento: 23 de septiembre de 1995", "dob:23 de septiembre de 1995;" },
        { "birthdate=19910615", "dob:19910615;" },
        { "I'm HIV positive and worried my employer will find out.", "health:I'm HIV positive;" },
        { "I am a type 1 diabetic.", "health:a type 1 diabetic;" },
        { "I'm in treatment for alcohol dependence.", "health:in treatment for alcohol dependence;" },
        { "I was told I have bipolar II disorder.", "health:told I have bipolar II disorder;" },
        { "Patient ID MRN-2291-0447", "id:MRN-2291-0447;" },
        { "mrn=\"A7730912\"", "id:A7730912;" },
        { "Kennzeichen: M-XY 4821", "id:M-XY 4821;" },
        { "reg plate is LK19 ZTP", "id:LK19 ZTP;" },
        { "immatriculation AB-482-CD", "id:AB-482-CD;" },
        { "plate number MH 12 AB 4821", "id:MH 12 AB 4821;" },
        { "the vin on the title is wvwzzz1k68w123456", "id:wvwzzz1k68w123456;" },
        { "Ravi Subramaniam's base salary is $142,500 plus a 15% bonus.", "money:$142,500;" },
        { "Employee: Greta Holm | Gross monthly: 5 830 EUR", "money:5 830 EUR;" },
        { "I earn 87k a year", "money:87k;" },
    };
    expect_found(&c, cases, sizeof cases / sizeof cases[0]);
    static const char *const negatives[] = {
        /* wallets: a digest named as one, the zero address, a hex digit short */
        "commit 0x9ba0719fbee1df35e7f710271130818c4e7e6b27",
        "burn it at 0x0000000000000000000000000000000000000000",
        "ETH wallet 0x9ba0719fbee1df35e7f710271130818c4e7e6b2 there",
        /* numbered lists: too short, a gap in the numbers, 13 words (no mnemonic's length) */
        "1. eggs 2. milk 3. bread",
        "1. orbit 2. siren 3. garlic 4. frost 5. pilot 6. umbrella 7. ripple 8. canyon 9. lizard 10. tumble 11. oxygen 13. harvest",
        "1. orbit 2. siren 3. garlic 4. frost 5. pilot 6. umbrella 7. ripple 8. canyon 9. lizard 10. tumble 11. oxygen 12. harvest 13. zebra",
        /* a setting's value, not a password: no sign, a locale, a word */
        "I set it to GPT4o-mini yesterday",
        "set it to en_US.UTF-8",
        "then set it to True",
        /* identifiers: a prefix no NINO has, no name before them, a checksum one off, a cue inside a word */
        "NI no. BG837261C",
        "my code is ks 62 03 91 d",
        "UID 1820-5917-3424",
        "order 6820-5917-3424 shipped",
        "PAN card: BNZXM4821K",
        "from Japan akrps7319q",
        "BSN: 271849308",
        "ABA: 322070476",
        "Codice fiscale: FRRLCU79E14L219C",
        "mi NIE es Y-3046217-M",
        "vin WVWZZZ1K78W123456",
        "part wvwzzz1k68w123456",
        "send the refund to IE91-BOFI-900017-48263916",
        "DL: 4 files",
        "Reisepass-Nr.: CHKRJXT9",
        "member id AB12CDE",                  /* letters and two digits: a passport's shape, not after a passport's name */
        /* plates: a word, letters only, digits only */
        "the plate number is unknown",
        "Kennzeichen: ABCD",
        "reg plate is 2024",
        /* addresses and phones */
        "use snake underscore case at work",
        "order 1234 5678 9012",
        "ref:1234567890",
        "ISBN 978-1-80107-318-9",
        "Pi is approximately 3.14159265358979.",
        "The build number is 20240517.3",
        "listen on 0.0.0.0 or 127.0.0.1",
        "route 192.0.2.0/24 via 198.51.100.7 and 203.0.113.9",
        /* twelve hex digits without a MAC's name, without a letter */
        "commit b827eb4c19d2",
        "the port b827eb4c19d2",
        "hw addr abcdefabcdef",
        /* coordinates: one number, a measurement, no place, out of range, a list of three */
        "Pi is 3.14159 exactly",
        "the loss was 0.1234, 0.5678",
        "scores 47.6205, 12.3493",
        "here: 95.1234, 10.0000",
        "my house is at 47.6205, -122.3493, 12.0001",
        /* dates, records, money */
        "birthdate=19911315",
        "mrn=\"ABCDEFG\"",
        "Earnings: 87k downloads a year",
        "Gross margin was 5 830 EUR",
    };
    expect_none(&c, negatives, sizeof negatives / sizeof negatives[0]);
    /* a document (the secrets policy): a Bitcoin address whose checksum holds is found, one a
     * character off, and an Ethereum address (no checksum checked), are not */
    struct { const char *text; size_t spans; } docs[] = {
        { "send the BTC to 1KouQwtqFRvGECGTm8JsCyf1sq93odFmRR", 1 },
        { "Send it to my wallet bc1qxy2kgdygjrsqtzq2n0yrf2493p83kkfjhx0wlh today.", 1 },
        { "send the BTC to 1KouQwtqFRvGECGTm8JsCyf1sq93odFmRQ", 0 },
        { "send it to bc1qxy2kgdygjrsqtzq2n0yrf2493p83kkfjhx0wlj today.", 0 },
        { "ETH wallet 0x9ba0719fbee1df35e7f710271130818c4e7e6b27", 0 },
    };
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        cp_spans s = { 0 };
        cp_error err = { 0 };
        cr_assert_eq(cp_chain_detect(&c, docs[i].text, strlen(docs[i].text), CP_ROLE_DOCUMENT, &s, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(s.n, docs[i].spans, "document %zu '%s': %zu spans", i, docs[i].text, s.n);
        cr_assert(s.n == 0 || strcmp(s.v[0].type, "crypto") == 0);
        cp_spans_free(&s);
    }
    /* the same Bitcoin address a character off is still one in a user's turn */
    char got[1024];
    found(&c, "send the BTC to 1KouQwtqFRvGECGTm8JsCyf1sq93odFmRQ", got, sizeof got);
    cr_assert_str_eq(got, "crypto:1KouQwtqFRvGECGTm8JsCyf1sq93odFmRQ;");
    cp_chain_free(&c);
}

/* a value past the key = value pattern's 256 bytes is marked to its end */
/* Japanese and Chinese addresses, written without spaces, are found from
 * their administrative units to the block or house number, and only that:
 * a pronoun or verb before them, or a lone number after a ward, stays out */
Test(detect, cjk_addresses_are_found_to_their_numbers)
{
    cp_detect_chain c = builtin_chain();
    static const found_case cases[] = {
        { "住所は東京都新宿区西新宿2-8-1です。", "address:東京都新宿区西新宿2-8-1;" },
        { "大阪市北区梅田3丁目1番1号に来てください", "address:大阪市北区梅田3丁目1番1号;" },
        { "横浜市中区山下町２７９－２５まで", "address:横浜市中区山下町２７９－２５;" },
        { "我住在北京市朝阳区建国路88号。", "address:北京市朝阳区建国路88号;" },
        { "请寄到广州市天河区体育西路123号", "address:广州市天河区体育西路123号;" },
        { "地址：上海市浦东新区世纪大道100号5号楼", "address:上海市浦东新区世纪大道100号5号楼;" },
    };
    expect_found(&c, cases, sizeof cases / sizeof cases[0]);
    static const char *const near[] = {
        "市の人口は200万人です", "第3地区1-2番", "東京都の2020年", "这条路5号线很挤", "区间1-2-3", "北京市有2000万人",
        "新宿区で3時に会いましょう", "市场路况很好", "请看第5号文件",
    };
    expect_none(&c, near, sizeof near / sizeof near[0]);
    cp_chain_free(&c);
}

/* a number read aloud or typed in words is as private as in digits: 7
 * digits or more, or 4 after a number's name, in English, French, Spanish
 * or German, with "oh", doubles, pairs and digit groups mixed in */
Test(detect, spelt_numbers_are_found_in_four_languages)
{
    cp_detect_chain c = builtin_chain();
    static const found_case cases[] = {
        { "call me at five five five, one two three, four five six seven ok",
          "phone:five five five, one two three, four five six seven;" },
        { "Five Five Five one two three four five six seven", "phone:Five Five Five one two three four five six seven;" },
        { "my card is four one one one one one one one one one one one one one one one thanks",
          "card:four one one one one one one one one one one one one one one one;" },
        { "ring me on oh two oh seven nine four six oh one two three", "phone:oh two oh seven nine four six oh one two three;" },
        { "it is oh seven seven double oh nine triple six one two", "phone:oh seven seven double oh nine triple six one two;" },
        { "555 one two three 4567 is my cell", "phone:555 one two three 4567;" },
        { "plus four four seven seven zero zero nine hundred", "phone:plus four four seven seven zero zero nine hundred;" },
        { "the card ends in four two one seven", "card:four two one seven;" },
        { "my phone: two one two, nine eight seven", "phone:two one two, nine eight seven;" },
        { "account number six four two nine one", "id:six four two nine one;" },
        { "social: one two three four five six seven eight one", "ssn:one two three four five six seven eight one;" },
        { "mon num\xc3\xa9ro : z\xc3\xa9ro six, douze, trente-quatre, cinquante-six, soixante-dix-huit",
          "phone:z\xc3\xa9ro six, douze, trente-quatre, cinquante-six, soixante-dix-huit;" },
        { "mi n\xc3\xbamero es seis uno dos, treinta y cuatro, cincuenta y seis",
          "phone:seis uno dos, treinta y cuatro, cincuenta y seis;" },
        { "meine Nummer ist null eins sieben zwo drei vier f\xc3\xbcnf sechs",
          "phone:null eins sieben zwo drei vier f\xc3\xbcnf sechs;" },
        { "ZWEI NULL VIER ACHT SIEBEN EINS DREI", "phone:ZWEI NULL VIER ACHT SIEBEN EINS DREI;" },
    };
    expect_found(&c, cases, sizeof cases / sizeof cases[0]);
    cp_chain_free(&c);
}

/* number words in prose stay shared: few of them, counting, a countdown,
 * even steps, one digit over and over, a list of sizes or scores, words
 * of two languages, "null" in data, a number spelt after no name and too
 * short, digits glued to words */
Test(detect, spelt_number_near_misses_are_prose)
{
    cp_detect_chain c = builtin_chain();
    static const char *const negatives[] = {
        "one or two of the three options",
        "I have two kids, one dog and three cats",
        "count with me: one two three four five six seven eight",
        "ten nine eight seven six five four three two one, liftoff",
        "sizes four, six, eight, ten, twelve and fourteen",
        "the judges gave nine, ten, seven, eight and six",
        "I have a number of ideas: one, two, three, four",
        "six six six six six six six",
        "[null, null, 1, null, 2, 3, 4, 5]",
        "oh oh oh, oh no, one two",
        "once one two three four five",
        "call me in five or ten minutes",
        "my phone has two cameras and one lens",
        "nineteen eighty four is a novel",
        "the score was two one, then three two",
        "un deux trois, nous irons au bois",
        "4one two three five six 7",
        "twenty one, twenty two, twenty three, twenty four",
        "she said one. two. three. four. five. six. seven.",
        "the judges gave nine, ten, seven, twelve, eight and six",
        "the numbers seventy-nine, fifty-four and forty-two are the results",
        "Seven,One Eight Seven,32464,187",
    };
    expect_none(&c, negatives, sizeof negatives / sizeof negatives[0]);
    cp_chain_free(&c);
}

Test(detect, a_long_value_is_marked_whole)
{
    cp_detect_chain c = builtin_chain();
    char text[1024];
    size_t n = (size_t)snprintf(text, sizeof text, "DB_PASSWORD=");
    for (int i = 0; i < 300; i++) text[n++] = i % 3 ? 'x' : '7';
    n += (size_t)snprintf(text + n, sizeof text - n, " and more");
    cp_spans s = { 0 };
    cp_error err = { 0 };
    cr_assert_eq(cp_chain_detect(&c, text, n, CP_ROLE_USER, &s, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(s.n, 1, "%zu spans", s.n);
    cr_assert_eq(s.v[0].start, 12);
    cr_assert_eq(s.v[0].end, 312, "the span ends at %u, not at the value's end", s.v[0].end);
    cp_spans_free(&s);
    cp_chain_free(&c);
}

Test(detect, validators_reject_near_misses)
{
    cp_detect_chain c = builtin_chain();
    static const char *const negatives[] = {
        "card 4111 1111 1111 1112 is wrong",    /* Luhn */
        "number 4111-111 11111-1111",           /* mixed separators, not four groups of four */
        "IBAN GB82 WEST 1234 5698 7654 33",     /* mod-97 */
        "IBAN GB82 WEST 1234 5698 7654",        /* GB length */
        "SSN 000-12-3456 and 666-12-3456",      /* area */
        "SSN 123-00-4567 and 123-45-0000",      /* group, serial */
        "SSN 900-12-3456",                      /* area 9xx */
        "ip 256.1.1.1 or 1.2.3",                /* octet, too short */
        "version 1.2.3.4.5 released",           /* not an address */
        "meet at 11:34:35 on 2000-04-16",       /* times and dates are not phones */
        "it costs 12345 dollars",               /* a bare short number */
        "Dear Sir, hello",                      /* a salutation, not a name */
        "token: aaaaaaaaaaaa",                  /* low-entropy value */
        "The password is required.",            /* prose after a password cue */
        "max_tokens: 256",                      /* a word that holds a cue, and a number */
        "PASSWORD: abc",                        /* too short to be one */
        "she suffers from a cold",              /* a cue, then an article */
        "risk-free investments and sk-learn",   /* no key after a prefix */
        "see sk-abcdefghijklmnopqrstuvwx here",  /* a prefix, then letters only: no key */
        /* code and placeholders after a key: no value */
        "password = getpass.getpass(\"Password: \")",
        "  password: !ENV ${POSTGRES_PASSWORD}",
        "self.password = hash_password(password)",
        "api_key = settings.API_KEY",
        "export OPENAI_API_KEY=YOUR_API_KEY",
        "POSTGRES_PASSWORD=example",
        "The password is required for login.",
        "The password is incorrect, try again.",
        "Authorization: Bearer tokenfromtheloginstep",  /* a word, not a credential: no digit, one case */
        "my email is not@valid",                /* no TLD */
        "install mysql\ncp -preserve=mode a b", /* -p on a line without a database client */
        "mysql -u root -p shopdb",              /* -p apart: mysql asks for the password, shopdb is the database */
        "install redis and openssl\ntar -a arch1 -k key1; ls -P dir1", /* client flags without their clients */
        "bypass=true and compass: north",       /* a word that ends in "pass" is no password */
        "docker run -p 8080:80 nginx",           /* docker's -p outside a login: a port */
        "max_tokens=1024\ntoken_type: bearer",  /* a key whose last part is not the token itself */
        "the wifi key management is fine",      /* a word after "key", not a key */
        "WiFi setup\nthe house key K9dd-2231",  /* a key on a line that does not name the network */
        "name,role\nann,admin",                /* a table without a secret column */
        "The password policy, as written, applies\nUsers rotate it yearly, as required.", /* prose with commas */
        "My password, which I never share",    /* a clause after the comma, not a value */
        "user,password\nalice,example",        /* a placeholder under the header */
        "just plain English prose with no identifiers at all.",
    };
    expect_none(&c, negatives, sizeof negatives / sizeof negatives[0]);
    cp_chain_free(&c);
}

static const char *write_rules(const char *name, const char *text)
{
    static char path[600];
    char dir[512];
    test_tmpdir(dir, sizeof dir, name);
    snprintf(path, sizeof path, "%s/rules.txt", dir);
    cr_assert(write_bytes(path, text, strlen(text)));
    return path;
}

Test(detect, rule_files)
{
    cp_detect_chain c = builtin_chain();
    cp_detector *d;
    cp_error err = { 0 };
    const char *p = write_rules("rules-ok", "# project rules\n\nregex employee_id EMP-\\d{6}\nkeyword codename Bluebird|Nightjar\n"
                                            "allow support@example\\.com\n");
    cr_assert_eq(cp_detector_rules(p, &d, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_chain_add(&c, d, &err), CP_OK);
    char got[512];
    found(&c, "EMP-123456 on project bluebird, mail support@example.com or ann@example.com", got, sizeof got);
    cr_assert_str_eq(got, "employee_id:EMP-123456;codename:bluebird;email:ann@example.com;", "got %s", got);
    cp_chain_free(&c);
    struct { const char *text, *needle; } bad[] = {
        { "regex ok a+\nfrobnicate x y\n", ":2: unknown rule 'frobnicate'" },
        { "\n\nregex t (unclosed\n", ":3: regex error" },
        { "keyword\n", ":1: 'keyword' needs a TYPE" },
        { "regex bad/type x\n", ":1: bad TYPE" },
        { "allow\n", ":1: 'allow' needs a pattern" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = write_rules("rules-bad", bad[i].text);
        cr_assert_eq(cp_detector_rules(p, &d, &err), CP_EFORMAT, "case %zu", i);
        cr_assert(strstr(err.msg, bad[i].needle), "case %zu: '%s' lacks '%s'", i, err.msg, bad[i].needle);
    }
    cr_assert_eq(cp_detector_rules("/nonexistent/rules", &d, &err), CP_EIO);
}

Test(detect, matching_errors_fail_closed)
{
    cp_detect_chain c;
    cp_detector *d;
    cp_error err = { 0 };
    cp_chain_init(&c);
    /* catastrophic backtracking spends the step budget: an error, never "no match" */
    const char *p = write_rules("rules-limit", "regex slow (a+)+$\n");
    cr_assert_eq(cp_detector_rules(p, &d, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_chain_add(&c, d, &err), CP_OK);
    char text[64];
    memset(text, 'a', 40);
    strcpy(text + 40, "!");
    cp_spans s = { 0 };
    cr_assert_eq(cp_chain_detect(&c, text, strlen(text), CP_ROLE_USER, &s, &err), CP_OK);
    cr_assert(s.wholly, "a match-limit error must fail closed");
    cr_assert_eq(c.failures, 1);
    cp_spans_free(&s);
    /* invalid UTF-8 reaching the built-ins is a matching error too */
    cp_chain_free(&c);
    c = builtin_chain();
    cr_assert_eq(cp_chain_detect(&c, "bad \xff byte", 10, CP_ROLE_USER, &s, &err), CP_OK);
    cr_assert(s.wholly);
    cp_spans_free(&s);
    cp_chain_free(&c);
}

static const char *plugin_path(char *buf, size_t cap, const char *name)
{
    const char *dir = getenv("CP_PLUGINS");
    snprintf(buf, cap, "%s/%s", dir && *dir ? dir : "build/tests", name);
    return buf;
}

static int run_one(cp_detector *d, const char *text, cp_spans *s)
{
    cp_detect_chain c;
    cp_error err = { 0 };
    cp_chain_init(&c);
    cr_assert_eq(cp_chain_add(&c, d, &err), CP_OK);
    memset(s, 0, sizeof *s);
    cr_assert_eq(cp_chain_detect(&c, text, strlen(text), CP_ROLE_USER, s, &err), CP_OK, "%s", err.msg);
    int fails = (int)c.failures;
    cp_chain_free(&c);
    return fails;
}

Test(detect, dlopen_plugin_and_its_failures)
{
    char path[600];
    plugin_path(path, sizeof path, "libcp_test_plugin.so");
    cp_detector *d;
    cp_error err = { 0 };
    cp_spans s;
    cr_assert_eq(cp_detector_dlopen(path, "ok", &d, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(run_one(d, "a secret and another secret", &s), 0);
    cr_assert(!s.wholly && s.n == 2 && s.v[0].start == 2 && s.v[1].start == 21 && strcmp(s.v[0].type, "so_secret") == 0);
    cp_spans_free(&s);
    const char *closed[] = { "error", "badspan" };
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(cp_detector_dlopen(path, closed[i], &d, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(run_one(d, "a secret", &s), 1, "%s must count as a failure", closed[i]);
        cr_assert(s.wholly && s.n == 0, "%s must fail closed", closed[i]);
        cp_spans_free(&s);
    }
    cr_assert_eq(cp_detector_dlopen(path, "fail-open", &d, &err), CP_EDEVICE);
    cr_assert_eq(cp_detector_dlopen("/nonexistent/x.so", "", &d, &err), CP_EIO);
    cr_assert(strstr(err.msg, "cannot load plugin"), "%s", err.msg);
}

Test(detect, process_plugin_and_its_failures)
{
    char path[600];
    plugin_path(path, sizeof path, "cp_test_proc_plugin");
    cp_detector *d;
    cp_error err = { 0 };
    cp_spans s;
    char *ok[] = { path, "ok", NULL };
    cr_assert_eq(cp_detector_process(ok, 2000, &d, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(run_one(d, "the secret word", &s), 0);
    cr_assert(!s.wholly && s.n == 1 && s.v[0].start == 4 && s.v[0].end == 10 && strcmp(s.v[0].type, "proc_secret") == 0);
    cp_spans_free(&s);
    /* the protocol errors of tests/test_plugin.c fail closed through the chain too */
    const char *modes[] = { "crash", "hang", "garbage", "badspan", "noid", "previous-id" };
    for (int i = 0; i < 6; i++) {
        char *argv[] = { path, (char *)modes[i], NULL };
        cr_assert_eq(cp_detector_process(argv, 300, &d, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(run_one(d, "the secret word", &s), 1, "%s must count as a failure", modes[i]);
        cr_assert(s.wholly && s.n == 0, "%s must fail closed", modes[i]);
        cp_spans_free(&s);
    }
}

Test(detect, role_policy)
{
    cp_detect_chain c = builtin_chain();
    cp_error err = { 0 };
    cp_spans s = { 0 };
    const char *t = "write to ann@example.com";
    cr_assert_eq(cp_chain_detect(&c, t, strlen(t), CP_ROLE_SYSTEM, &s, &err), CP_OK);
    cr_assert(s.n == 1 && !s.wholly, "system prompts get every format recognizer by default (a profile's e-mail address)");
    cp_spans_free(&s);
    cr_assert_eq(cp_chain_detect(&c, t, strlen(t), CP_ROLE_DOCUMENT, &s, &err), CP_OK);
    cr_assert(s.n == 0 && !s.wholly, "documents are shared: a contact address in one is not a secret");
    /* a credential or a card is found in both shared roles (documents: secrets; system prompts: formats) */
    const char *keyed = "Call the API with sk_live_4eC39HqLyjWDarjtT1zdp7dc; bill 4111 1111 1111 1111.";
    const cp_role shared_roles[2] = { CP_ROLE_SYSTEM, CP_ROLE_DOCUMENT };
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(cp_chain_detect(&c, keyed, strlen(keyed), shared_roles[i], &s, &err), CP_OK);
        cr_assert(s.n == 2 && !s.wholly && strcmp(s.v[0].type, "secret") == 0 && strcmp(s.v[1].type, "card") == 0,
                  "role %d: %zu spans", (int)shared_roles[i], s.n);
        cp_spans_free(&s);
    }
    cr_assert_eq(cp_chain_set_policy(&c, "document=public", &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_chain_detect(&c, keyed, strlen(keyed), CP_ROLE_DOCUMENT, &s, &err), CP_OK);
    cr_assert(s.n == 0 && !s.wholly, "public: never scanned");
    cr_assert_eq(cp_chain_set_policy(&c, "document=secrets", &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_chain_detect(&c, t, strlen(t), CP_ROLE_USER, &s, &err), CP_OK);
    cr_assert_eq(s.n, 1);
    cp_spans_free(&s);
    cr_assert_eq(cp_chain_set_policy(&c, "user=sensitive,document=scan", &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_chain_detect(&c, "harmless", 8, CP_ROLE_USER, &s, &err), CP_OK);
    cr_assert(s.wholly);
    cp_spans_free(&s);
    cr_assert_eq(cp_chain_detect(&c, t, strlen(t), CP_ROLE_DOCUMENT, &s, &err), CP_OK);
    cr_assert_eq(s.n, 1);
    cp_spans_free(&s);
    /* free-text detectors (names, NER, plugins) never run on a `formats` role: a template's names keep its sharing */
    cp_detector *names;
    cr_assert_eq(cp_detector_names(&names, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_chain_add(&c, names, &err), CP_OK);
    const char *named = "Ask Benedikt Kamau about the lease.";
    cr_assert_eq(cp_chain_detect(&c, named, strlen(named), CP_ROLE_SYSTEM, &s, &err), CP_OK);
    cr_assert(s.n == 0 && !s.wholly, "the names recognizer ran on a system prompt");
    cr_assert_eq(cp_chain_set_policy(&c, "system=scan", &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_chain_detect(&c, named, strlen(named), CP_ROLE_SYSTEM, &s, &err), CP_OK);
    cr_assert(s.n >= 1, "system=scan: the names recognizer runs");
    cp_spans_free(&s);
    cr_assert_eq(cp_chain_set_policy(&c, "user=maybe", &err), CP_EINVAL);
    cr_assert_eq(cp_chain_set_policy(&c, "robot=scan", &err), CP_EINVAL);
    cp_chain_free(&c);
}

Test(detect, pii_markers)
{
    cp_spans s = { 0 };
    cp_error err = { 0 };
    char *clean;
    size_t n;
    const char *t = "Call <pii>Ann</pii> at <pii>home</pii>.";
    cr_assert_eq(cp_strip_pii_markers(t, strlen(t), &clean, &n, &s, &err), CP_OK, "%s", err.msg);
    cr_assert_str_eq(clean, "Call Ann at home.");
    cr_assert(s.n == 2 && s.v[0].start == 5 && s.v[0].end == 8 && s.v[1].start == 12 && s.v[1].end == 16);
    free(clean);
    cp_spans_free(&s);
    const char *bad[] = { "a <pii>b", "a </pii>", "<pii><pii>x</pii></pii>" };
    for (int i = 0; i < 3; i++) cr_assert_eq(cp_strip_pii_markers(bad[i], strlen(bad[i]), &clean, &n, &s, &err), CP_EFORMAT);
    cp_spans_free(&s);
}

/* A span covering part of a token marks the whole token; pad marks k
 * tokens each side; wholly marks every token. */
static void check_mask(const char *rel)
{
    cp_tokenizer *t = open_tokenizer_or_die(rel);
    cp_error err = { 0 };
    const char *text = "Please email annabelle.smith@example.com about it";
    cp_encoding e = { 0 };
    cr_assert_eq(cp_tokenize(t, text, strlen(text), 0, &e, &err), CP_OK, "%s", err.msg);
    cp_spans s = { 0 };
    uint32_t a = (uint32_t)(strstr(text, "bell") - text); /* inside the first name */
    cr_assert_eq(cp_spans_add(&s, a, a + 4, "x", 1, &err), CP_OK);
    uint8_t *m0 = calloc(e.n, 1), *m1 = calloc(e.n, 1);
    cp_spans_to_mask(&s, 0, &e, 0, e.n, 0, m0);
    cp_spans_to_mask(&s, 0, &e, 0, e.n, 1, m1);
    size_t first = e.n, last = 0, n0 = 0, n1 = 0;
    for (size_t k = 0; k < e.n; k++) {
        int overlaps = e.start[k] < a + 4 && e.end[k] > a;
        cr_assert_eq(m0[k], overlaps, "%s: token %zu [%u,%u) mask %d", rel, k, e.start[k], e.end[k], m0[k]);
        if (m0[k]) {
            if (k < first) first = k;
            last = k;
            n0++;
        }
        n1 += m1[k];
    }
    cr_assert_gt(n0, 0);
    size_t want = last - first + 1 + (first > 0) + (last + 1 < e.n);
    cr_assert_eq(n1, want, "%s: padding by 1 marks %zu tokens, want %zu", rel, n1, want);
    s.wholly = 1;
    memset(m0, 0, e.n);
    cp_spans_to_mask(&s, 0, &e, 0, e.n, 0, m0);
    for (size_t k = 0; k < e.n; k++) cr_assert(m0[k]);
    free(m0), free(m1);
    cp_spans_free(&s);
    cp_encoding_free(&e);
    cp_tokenizer_free(t);
}

Test(detect, span_to_token_mask)
{
    check_mask("models/qwen-bpe-tokenizer-qwen3");
    check_mask("models/mistral-7b-v0.1-tokenizer");
}

/* A child started after a failure gets the probe's start allowance for its
 * first answer: with a 500 ms timeout and a plugin that takes 0.7 s to
 * start, the message after a timed-out one is answered (before, the
 * restart's own start timed it out too, and so on while the runtime was
 * slow to start: the NER plugin on a loaded machine). */
Test(detect, restarted_plugin_has_its_start_allowance, .timeout = TEST_TIMEOUT(30))
{
    char path[600];
    plugin_path(path, sizeof path, "cp_test_proc_plugin");
    cp_detector *d;
    cp_error err = { 0 };
    char *argv[] = { path, "slow-start", NULL };
    cr_assert_eq(cp_detector_process(argv, 500, &d, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_detector_process_probe(d, 10000, &err), CP_OK, "%s", err.msg);
    cp_detect_chain c;
    cp_chain_init(&c);
    cr_assert_eq(cp_chain_add(&c, d, &err), CP_OK);
    const char *texts[] = { "the secret word", "slow secret", "the secret word" };
    int want_wholly[] = { 0, 1, 0 };
    for (int i = 0; i < 3; i++) {
        cp_spans s = { 0 };
        cr_assert_eq(cp_chain_detect(&c, texts[i], strlen(texts[i]), CP_ROLE_USER, &s, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(s.wholly, want_wholly[i], "message %d: wholly %d", i, s.wholly);
        if (!want_wholly[i]) cr_assert(s.n == 1 && s.v[0].start == 4 && s.v[0].end == 10, "message %d: %zu spans", i, s.n);
        cp_spans_free(&s);
    }
    cp_chain_free(&c);
}
