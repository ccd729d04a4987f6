/* Roman numerals in C: built once per candidate, run once per case (an integer on stdin, a JSON string out). */
#include <stdio.h>
#include <string.h>

// EVOLVE-BLOCK-START
/* Only knows I, V and X, and no subtractive forms yet. */
static void solve(int n, char *out) {
    static const int values[] = {10, 5, 1};
    static const char *letters[] = {"X", "V", "I"};
    out[0] = '\0';
    for (int i = 0; i < 3; i++) {
        while (n >= values[i] && strlen(out) < 60) {
            strcat(out, letters[i]);
            n -= values[i];
        }
    }
}
// EVOLVE-BLOCK-END

int main(void) {
    int n;
    char out[64 + 1024]; /* 64 promised; the rest keeps a sloppy candidate from corrupting the stack */
    if (scanf("%d", &n) != 1) return 2;
    solve(n, out);
    out[63] = '\0';
    printf("\"%s\"\n", out);
    return 0;
}
