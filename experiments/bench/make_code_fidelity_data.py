"""Writes the code-fidelity benchmark's own problems: experiments/bench/data/code_fidelity_{mbpp,stdio}.jsonl.

    python experiments/bench/make_code_fidelity_data.py

MBPP is not shipped in an installed package, so the assert-list and stdin/stdout formats get problems
written here, each with a reference solution. The expected values are never typed by hand: this (trusted)
process runs each reference on each input and writes what it returns (asserts) or prints (stdio), so a
reference that fails its own tests is impossible by construction. The benchmark then checks that the
sandboxed code reward agrees: every reference must score 1.

- MBPP rows have MBPP's columns (`task_id`, `text`, `code`, `test_list`, `test_imports`) and go through
  `tasks.adapters.mbpp_row`, as a dataset row would. A call is judged by `==` against the value's repr,
  by `math.isclose` for floats, or, where the reference raises, by try/except on the exception's type.
- stdio rows are `{"task_id", "text", "code", "io": [{"input" | "input_gen", "output"}]}`; `input_gen`
  (`{"seed", "n", "lo", "hi", "layout"}`) stands for a large input that the benchmark's `expand_input` makes
  at load time, so the file stays small while a case still reads 10^5 numbers.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

from bench_code_fidelity import expand_input  # this script runs from experiments/bench/, beside it

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
MBPP_PATH = os.path.join(DATA, "code_fidelity_mbpp.jsonl")
STDIO_PATH = os.path.join(DATA, "code_fidelity_stdio.jsonl")

# ----------------------------------------------------------------------------------------- MBPP-style
# (name, text, code, extra test imports, [argument tuples written as Python source, or (setup, expression)])
MBPP: list[tuple[str, str, str, list[str], list[Any]]] = [
    ("max_sub_sum", "Write a function to find the largest sum of a contiguous sublist.",
     """\
def max_sub_sum(xs):
    best = cur = xs[0]
    for x in xs[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    return best
""",
     [], ["[-2, 1, -3, 4, -1, 2, 1, -5, 4]", "[1]", "[-3, -1, -2]"]),
    ("is_palindrome", "Write a function to check whether a string is a palindrome, ignoring case and non-letters.",
     """\
def is_palindrome(s):
    t = [c.lower() for c in s if c.isalnum()]
    return t == t[::-1]
""",
     [], ["'A man, a plan, a canal: Panama'", "'race a car'", "''"]),
    ("word_count", "Write a function that counts the words of a text, case-insensitively, as a dict.",
     """\
from collections import Counter
import re

def word_count(text):
    return dict(Counter(re.findall(r"[a-z']+", text.lower())))
""",
     [], ["'the cat and The hat'", "''", '"Don\'t stop, don\'t."']),
    ("hypotenuse", "Write a function to find the hypotenuse of a right-angled triangle.",
     """\
import math

def hypotenuse(a, b):
    return math.sqrt(a * a + b * b)
""",
     [], ["3, 4", "1, 1", "0.1, 0.2"]),
    ("common_elements", "Write a function to find the common elements of two lists, as a set.",
     """\
def common_elements(a, b):
    return set(a) & set(b)
""",
     [], ["[1, 2, 3, 4], [3, 4, 5]", "[1], [2]", "['a', 'b'], ['b', 'c', 'a']"]),
    ("min_max", "Write a function that returns the smallest and the largest item of a list as a tuple.",
     """\
def min_max(xs):
    return (min(xs), max(xs))
""",
     [], ["[3, 1, 4, 1, 5]", "[7]", "[-1.5, 2.5]"]),
    ("safe_div", "Write a function that divides a by b and raises ValueError when b is zero.",
     """\
def safe_div(a, b):
    if b == 0:
        raise ValueError('division by zero')
    return a / b
""",
     [], ["6, 3", "1, 0", "7, 2"]),
    ("nth_prime", "Write a function to find the n-th prime number.",
     """\
def is_prime(n):
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def nth_prime(n):
    count, k = 0, 1
    while count < n:
        k += 1
        if is_prime(k):
            count += 1
    return k
""",
     [], ["1", "10", "100"]),
    ("pairs_sum", "Write a function that returns all pairs (as tuples, i < j) of positions whose "
                  "items sum to a target.",
     """\
from itertools import combinations

def pairs_sum(xs, target):
    return [(i, j) for i, j in combinations(range(len(xs)), 2) if xs[i] + xs[j] == target]
""",
     [], ["[1, 2, 3, 4, 5], 5", "[0, 0, 0], 0", "[], 1"]),
    ("k_smallest", "Write a function to find the k smallest numbers of a list, in order, using a heap.",
     """\
import heapq

def k_smallest(xs, k):
    return heapq.nsmallest(k, xs)
""",
     [], ["[5, 1, 9, 3, 7], 2", "[4, 4, 4], 3", "[10, -1], 0"]),
    ("group_anagrams", "Write a function that groups words that are anagrams of one another (a dict "
                       "from the sorted letters to the words).",
     """\
from collections import defaultdict

def group_anagrams(words):
    groups = defaultdict(list)
    for w in words:
        groups[''.join(sorted(w))].append(w)
    return dict(groups)
""",
     [], ["['eat', 'tea', 'tan', 'ate', 'nat', 'bat']", "[]", "['a']"]),
    ("mean_std", "Write a function returning the mean and the population standard deviation of a list.",
     """\
import math

def mean_std(xs):
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
""",
     [], ["[1, 2, 3, 4]", "[2.5, 2.5]", "[0.1, 0.2, 0.3]"]),
    ("flatten", "Write a function to flatten an arbitrarily nested list.",
     """\
def flatten(xs):
    out = []
    for x in xs:
        if isinstance(x, list):
            out.extend(flatten(x))
        else:
            out.append(x)
    return out
""",
     [], ["[1, [2, [3, [4]], 5]]", "[]", "[[[]]]"]),
    ("rle", "Write a function for run-length encoding of a string, as a list of (char, count) tuples.",
     """\
from itertools import groupby

def rle(s):
    return [(k, len(list(g))) for k, g in groupby(s)]
""",
     [], ["'aaabccdddd'", "''", "'abc'"]),
    ("to_roman", "Write a function to convert an integer to a roman numeral.",
     """\
def to_roman(n):
    vals = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'),
            (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]
    out = ''
    for v, s in vals:
        while n >= v:
            out += s
            n -= v
    return out
""",
     [], ["1994", "4", "3999"]),
    ("from_roman", "Write a function to convert a roman numeral to an integer.",
     """\
def from_roman(s):
    v = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}
    total = 0
    for a, b in zip(s, s[1:] + ' '):
        total += -v[a] if b != ' ' and v[a] < v[b] else v[a]
    return total
""",
     [], ["'MCMXCIV'", "'IV'", "'MMMCMXCIX'"]),
    ("gcd_list", "Write a function to find the greatest common divisor of a list of integers.",
     """\
import math
from functools import reduce

def gcd_list(xs):
    return reduce(math.gcd, xs)
""",
     [], ["[12, 18, 24]", "[7]", "[0, 5]"]),
    ("char_freq", "Write a function returning the frequency of each character as a collections.Counter.",
     """\
from collections import Counter

def char_freq(s):
    return Counter(s)
""",
     [], ["'hello'", "''", "'aab'"]),
    ("unique_sorted", "Write a function that returns the sorted unique items of a list as a tuple.",
     """\
def unique_sorted(xs):
    return tuple(sorted(set(xs)))
""",
     [], ["[3, 1, 3, 2]", "[]", "['b', 'a', 'b']"]),
    ("matrix_mult", "Write a function to multiply two matrices given as lists of lists.",
     """\
def matrix_mult(a, b):
    return [[sum(x * y for x, y in zip(row, col)) for col in zip(*b)] for row in a]
""",
     [], ["[[1, 2], [3, 4]], [[5, 6], [7, 8]]", "[[1]], [[2]]", "[[1, 0, 2]], [[1], [2], [3]]"]),
    ("transpose", "Write a function to transpose a matrix.",
     """\
def transpose(m):
    return [list(r) for r in zip(*m)]
""",
     [], ["[[1, 2, 3], [4, 5, 6]]", "[[1]]", "[]"]),
    ("extract_numbers", "Write a function that extracts all integers (with sign) from a string.",
     """\
import re

def extract_numbers(s):
    return [int(x) for x in re.findall(r'-?\\d+', s)]
""",
     [], ["'a1b22c-3'", "'none'", "'x = -10 + 20'"]),
    ("camel_to_snake", "Write a function to convert a camelCase string to snake_case.",
     """\
import re

def camel_to_snake(s):
    return re.sub(r'(?<!^)(?=[A-Z])', '_', s).lower()
""",
     [], ["'camelCaseString'", "'already'", "'HTTPServer'"]),
    ("fib", "Write a function to compute the n-th Fibonacci number (fib(0) = 0) with memoisation.",
     """\
from functools import lru_cache

@lru_cache(maxsize=None)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
""",
     [], ["0", "10", "90"]),
    ("binary_search", "Write a function returning the position of x in a sorted list, or -1.",
     """\
import bisect

def binary_search(xs, x):
    i = bisect.bisect_left(xs, x)
    return i if i < len(xs) and xs[i] == x else -1
""",
     [], ["[1, 3, 5, 7], 5", "[1, 3, 5, 7], 4", "[], 1"]),
    ("dict_invert", "Write a function that inverts a dict (values become keys).",
     """\
def dict_invert(d):
    return {v: k for k, v in d.items()}
""",
     [], ["{'a': 1, 'b': 2}", "{}", "{1: 'x'}"]),
    ("merge_dicts", "Write a function that merges two dicts, summing the values of common keys.",
     """\
def merge_dicts(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out
""",
     [], ["{'a': 1, 'b': 2}, {'b': 3, 'c': 4}", "{}, {}", "{'x': 1.5}, {'x': 2.5}"]),
    ("area_circle", "Write a function to find the area of a circle.",
     """\
import math

def area_circle(r):
    return math.pi * r ** 2
""",
     [], ["1", "2.5", "10"]),
    ("compound_interest", "Write a function for the compound interest amount after n years.",
     """\
def compound_interest(p, rate, n):
    return p * (1 + rate / 100) ** n
""",
     [], ["1000, 5, 10", "1, 0, 3", "250.5, 3.3, 7"]),
    ("sqrt_newton", "Write a function computing a square root by Newton's method.",
     """\
def sqrt_newton(x):
    if x < 0:
        raise ValueError('negative')
    if x == 0:
        return 0.0
    g = x
    for _ in range(60):
        g = (g + x / g) / 2
    return g
""",
     [], ["2", "144", "-1"]),
    ("parse_int", "Write a function that parses an integer string and raises ValueError on bad input.",
     """\
def parse_int(s):
    return int(s.strip())
""",
     [], ["' 42 '", "'-7'", "'4x'"]),
    ("get_item", "Write a function returning the value of key k or raising KeyError.",
     """\
def get_item(d, k):
    return d[k]
""",
     [], ["{'a': 1}, 'a'", "{'a': 1}, 'b'", "{1: [2]}, 1"]),
    ("chunk", "Write a function that splits a list into chunks of size n.",
     """\
def chunk(xs, n):
    return [xs[i:i + n] for i in range(0, len(xs), n)]
""",
     [], ["[1, 2, 3, 4, 5], 2", "[], 3", "[1], 1"]),
    ("rotate_left", "Write a function that rotates a list left by k places.",
     """\
from collections import deque

def rotate_left(xs, k):
    d = deque(xs)
    d.rotate(-k)
    return list(d)
""",
     [], ["[1, 2, 3, 4, 5], 2", "[1], 5", "[], 1"]),
    ("powerset", "Write a function returning all subsets of a list as a list of tuples, by size.",
     """\
from itertools import chain, combinations

def powerset(xs):
    return list(chain.from_iterable(combinations(xs, r) for r in range(len(xs) + 1)))
""",
     [], ["[1, 2, 3]", "[]", "['a']"]),
    ("permutations_str", "Write a function returning the sorted distinct permutations of a string.",
     """\
from itertools import permutations

def permutations_str(s):
    return sorted(set(''.join(p) for p in permutations(s)))
""",
     [], ["'abc'", "'aab'", "''"]),
    ("balanced", "Write a function that checks whether the brackets of a string are balanced.",
     """\
def balanced(s):
    pairs = {')': '(', ']': '[', '}': '{'}
    stack = []
    for c in s:
        if c in '([{':
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack
""",
     [], ["'([]{})'", "'(]'", "'(('"]),
    ("vowel_count", "Write a function counting the vowels of a string.",
     """\
def vowel_count(s):
    return sum(c in 'aeiouAEIOU' for c in s)
""",
     [], ["'Hello World'", "'xyz'", "'AEIOU'"]),
    ("title_case", "Write a function that capitalises the first letter of each word.",
     """\
def title_case(s):
    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))
""",
     [], ["'hello world'", "'a  b'", "''"]),
    ("second_largest", "Write a function to find the second largest distinct number, or None.",
     """\
def second_largest(xs):
    s = sorted(set(xs), reverse=True)
    return s[1] if len(s) > 1 else None
""",
     [], ["[1, 3, 2, 3]", "[5, 5]", "[]"]),
    ("digits_sum", "Write a function returning the sum of the digits of a non-negative integer.",
     """\
def digits_sum(n):
    return sum(map(int, str(n)))
""",
     [], ["12345", "0", "10 ** 20"]),
    ("bytes_xor", "Write a function that XORs two byte strings of equal length.",
     """\
def bytes_xor(a, b):
    return bytes(x ^ y for x, y in zip(a, b))
""",
     [], ["b'abc', b'   '", "b'', b''", "b'\\x00\\xff', b'\\xff\\xff'"]),
    ("frac_sum", "Write a function summing a list of fractions exactly.",
     """\
from fractions import Fraction

def frac_sum(xs):
    return sum((Fraction(x) for x in xs), Fraction(0))
""",
     ["from fractions import Fraction"], ["['1/2', '1/3', '1/6']", "[]", "['3/4', '-1/4']"]),
    ("decimal_round", "Write a function that rounds a decimal string half-up to 2 places.",
     """\
from decimal import Decimal, ROUND_HALF_UP

def decimal_round(s):
    return Decimal(s).quantize(Decimal('0.01'), rounding=ROUND_HALF_UP)
""",
     ["from decimal import Decimal"], ["'2.675'", "'1.005'", "'-0.125'"]),
    ("Stack_ops", "Write a function that applies push/pop operations to a stack class and returns "
                  "what the pops gave.",
     """\
class Stack:
    def __init__(self):
        self.items = []

    def push(self, x):
        self.items.append(x)

    def pop(self):
        return self.items.pop()


def Stack_ops(ops):
    s, out = Stack(), []
    for op in ops:
        if op == 'pop':
            out.append(s.pop())
        else:
            s.push(op)
    return out
""",
     [], ["[1, 2, 'pop', 3, 'pop', 'pop']", "[]", "['a', 'pop']"]),
    ("np_dot", "Write a function using numpy that returns the dot product of two vectors as a float.",
     """\
import numpy as np

def np_dot(a, b):
    return float(np.dot(np.array(a, dtype=float), np.array(b, dtype=float)))
""",
     [], ["[1, 2, 3], [4, 5, 6]", "[0.5], [0.25]", "[], []"]),
    ("np_cumsum", "Write a function using numpy returning the cumulative sums of a list as a list.",
     """\
import numpy as np

def np_cumsum(xs):
    return np.cumsum(np.array(xs, dtype=np.int64)).tolist()
""",
     [], ["[1, 2, 3, 4]", "[5]", "[-1, 1, -1]"]),
    ("np_mean", "Write a function using numpy returning the mean of a list.",
     """\
import numpy as np

def np_mean(xs):
    return np.mean(xs)
""",
     [], ["[1, 2, 3, 4]", "[0.1, 0.7]", "[10]"]),
    ("lcm_range", "Write a function returning the least common multiple of 1..n.",
     """\
from math import gcd

def lcm_range(n):
    out = 1
    for k in range(1, n + 1):
        out = out * k // gcd(out, k)
    return out
""",
     [], ["10", "1", "30"]),
    ("interleave", "Write a function that interleaves two lists, appending the rest of the longer one.",
     """\
from itertools import zip_longest

_SKIP = object()

def interleave(a, b):
    return [x for pair in zip_longest(a, b, fillvalue=_SKIP) for x in pair if x is not _SKIP]
""",
     [], ["[1, 2, 3], ['a', 'b']", "[], [1]", "[None], [None, 0]"]),
    ("sort_by_len", "Write a function sorting strings by length, then alphabetically.",
     """\
def sort_by_len(words):
    return sorted(words, key=lambda w: (len(w), w))
""",
     [], ["['bb', 'a', 'ccc', 'ab']", "[]", "['x']"]),
    ("dedupe_keep_order", "Write a function removing duplicates while keeping the first occurrence's order.",
     """\
def dedupe_keep_order(xs):
    seen = set()
    out = []
    for x in xs:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out
""",
     [], ["[3, 1, 3, 2, 1]", "[]", "['a', 'A', 'a']"]),
    ("count_inversions", "Write a function counting the inversions of a list (merge sort).",
     """\
def count_inversions(xs):
    def sort(a):
        if len(a) < 2:
            return a, 0
        m = len(a) // 2
        left, x = sort(a[:m])
        right, y = sort(a[m:])
        merged, i, j, inv = [], 0, 0, x + y
        while i < len(left) and j < len(right):
            if left[i] <= right[j]:
                merged.append(left[i])
                i += 1
            else:
                merged.append(right[j])
                inv += len(left) - i
                j += 1
        return merged + left[i:] + right[j:], inv
    return sort(list(xs))[1]
""",
     [], ["[2, 4, 1, 3, 5]", "[5, 4, 3, 2, 1]", "[]"]),
    ("matrix_det", "Write a function computing the determinant of a square matrix (floats) by elimination.",
     """\
def matrix_det(m):
    a = [list(map(float, r)) for r in m]
    n, det = len(a), 1.0
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(a[r][c]))
        if a[p][c] == 0:
            return 0.0
        if p != c:
            a[c], a[p] = a[p], a[c]
            det = -det
        det *= a[c][c]
        for r in range(c + 1, n):
            f = a[r][c] / a[c][c]
            for k in range(c, n):
                a[r][k] -= f * a[c][k]
    return det
""",
     [], ["[[1, 2], [3, 4]]", "[[2, 0, 0], [0, 3, 0], [0, 0, 4]]", "[[0.5, 1.5], [2.5, 3.5]]"]),
    ("big_pow_mod", "Write a function computing a**b mod m for large numbers.",
     """\
def big_pow_mod(a, b, m):
    return pow(a, b, m)
""",
     [], ["2, 10 ** 18, 10 ** 9 + 7", "3, 0, 5", "10 ** 30, 3, 10 ** 40"]),
    ("nested_get", "Write a function that follows a path of keys into nested dicts, returning a "
                   "default when one is missing.",
     """\
def nested_get(d, path, default=None):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d
""",
     [], ["{'a': {'b': {'c': 1}}}, ['a', 'b', 'c']", "{'a': 1}, ['a', 'b'], 'none'", "{}, []"]),
    ("sum_floats", "Write a function adding a list of floats accurately.",
     """\
import math

def sum_floats(xs):
    return math.fsum(xs)
""",
     [], ["[0.1] * 10", "[1e100, 1.0, -1e100]", "[]"]),
    ("split_even_odd", "Write a function returning (evens, odds) of a list, as two tuples.",
     """\
def split_even_odd(xs):
    return tuple(x for x in xs if x % 2 == 0), tuple(x for x in xs if x % 2)
""",
     [], ["[1, 2, 3, 4, 5]", "[]", "[0, -1]"]),
    ("frozen_groups", "Write a function returning the set of frozensets of letters of each word.",
     """\
def frozen_groups(words):
    return {frozenset(w) for w in words}
""",
     [], ["['ab', 'ba', 'c']", "[]", "['aa']"]),
    ("check_type", "Write a function that raises TypeError for a non-string argument and returns its "
                   "length otherwise.",
     """\
def check_type(s):
    if not isinstance(s, str):
        raise TypeError('expected str')
    return len(s)
""",
     [], ["'abc'", "5", "None"]),
    # Patterns of the real MBPP's tests: a (setup, expression) pair is asserted equal, floats included, to
    # the value the expression had here (exact `==` on floats, as many MBPP rows write them).
    ("max_chain_length", "Write a function to find the longest chain of pairs (a, b), (c, d) with b <"
                         " c; the tests build the pairs with the Pair class (MBPP's own task 601).",
     """\
class Pair(object):
    def __init__(self, a, b):
        self.a = a
        self.b = b


def max_chain_length(arr, n):
    mcl = [1] * n
    for i in range(1, n):
        for j in range(i):
            if arr[i].a > arr[j].b and mcl[i] < mcl[j] + 1:
                mcl[i] = mcl[j] + 1
    return max(mcl)
""",
     [], [("", "max_chain_length([Pair(5, 24), Pair(15, 25), Pair(27, 40), Pair(50, 60)], 4)"),
          ("", "max_chain_length([Pair(1, 2), Pair(3, 4), Pair(5, 6), Pair(7, 8)], 4)")]),
    ("area_rect", "Write a function to find the area of a rectangle.",
     """\
def area_rect(w, h):
    return w * h
""",
     [], [("", "area_rect(2.5, 4)"), ("", "area_rect(0.1, 3)"), ("", "area_rect(3, 7)")]),
    ("power", "Write a function raising base to exp (default 2).",
     """\
def power(base, exp=2):
    return base ** exp
""",
     [], [("", "power(3)"), ("", "power(3, exp=3)"), ("", "power(base=2, exp=10)")]),
    ("encode", "Write encode (shift every letter by one) and decode (its inverse).",
     """\
def encode(s):
    return ''.join(chr(ord(c) + 1) for c in s)


def decode(s):
    return ''.join(chr(ord(c) - 1) for c in s)
""",
     [], [("", "decode(encode('hello'))"), ("", "encode('abc')"), ("", "decode('')")]),
    ("sort_in_place", "Write a function that sorts a list in place and returns nothing.",
     """\
def sort_in_place(xs):
    xs.sort()
""",
     [], [("xs = [3, 1, 2]\nsort_in_place(xs)", "xs"),
          ("", "sort_in_place([2, 1])"),
          ("ys = []\nsort_in_place(ys)", "ys")]),
    ("gen_squares", "Write a generator yielding the squares of 0..n-1.",
     """\
def gen_squares(n):
    for i in range(n):
        yield i * i
""",
     [], [("", "list(gen_squares(5))"), ("", "sum(gen_squares(10 ** 5))"), ("", "next(gen_squares(3))")]),
    ("range_list", "Write a function returning the list 0..n-1.",
     """\
def range_list(n):
    return list(range(n))
""",
     [], [("", "len(range_list(10 ** 5))"), ("", "range_list(3)"), ("", "sum(range_list(10 ** 5))")]),
    ("count_down", "Write a recursive function counting the steps from n down to 0.",
     """\
def count_down(n):
    return 0 if n == 0 else 1 + count_down(n - 1)
""",
     [], [("", "count_down(900)"), ("", "count_down(0)")]),
    ("reverse_text", "Write a function reversing a string.",
     """\
def reverse_text(s):
    return s[::-1]
""",
     [], [("", "reverse_text('héllo wörld')"), ("", "reverse_text('日本')")]),
    ("grid_neighbours", "Write a function mapping each cell (r, c) of an n x n grid to its neighbour count.",
     """\
def grid_neighbours(n):
    return {(r, c): sum(0 <= r + dr < n and 0 <= c + dc < n for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)))
            for r in range(n) for c in range(n)}
""",
     [], [("", "grid_neighbours(2)"), ("", "grid_neighbours(3)[(1, 1)]")]),
    ("find_duplicates", "Write a function returning the items that occur more than once.",
     """\
from collections import Counter

def find_duplicates(xs):
    return [x for x, k in Counter(xs).items() if k > 1]
""",
     [], [("", "set(find_duplicates([1, 2, 2, 3, 3, 3]))"), ("", "sorted(find_duplicates(['a', 'b', 'a']))")]),
]


def _float_like(value: Any) -> bool:
    """A value judged by math.isclose: a float, or a tuple/list of floats (mean_std's pair)."""
    return isinstance(value, float) or (isinstance(value, (tuple, list)) and value
                                        and all(isinstance(v, float) for v in value))


def mbpp_assert(name: str, args: str, value: Any, error: BaseException | None) -> str:
    """One assert line (or try/except block) judging `name(args)` against what the reference did."""
    call = f"{name}({args})"
    if error is not None:
        kind = type(error).__name__
        return f"try:\n    {call}\nexcept {kind}:\n    pass\nelse:\n    raise AssertionError('expected {kind}')"
    if _float_like(value) and not isinstance(value, float):
        expected = ", ".join(repr(float(v)) for v in value)
        return f"assert all(math.isclose(a, b, rel_tol=1e-09) for a, b in zip({call}, [{expected}]))"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return f"assert {call} == float({str(value)!r})"
        return f"assert math.isclose({call}, {float(value)!r}, rel_tol=1e-09)"  # a numpy float as written
    text = repr(value)
    if type(value).__name__ == "Counter":
        text = f"Counter({dict(value)!r})"
    return f"assert {call} == {text}"


def mbpp_raw_assert(setup: str, expression: str, space: dict[str, Any]) -> str:
    """`setup`, then `assert <expression> == <its value after setup here>`."""
    exec(setup, space)  # noqa: S102 - trusted reference and setup
    value = eval(expression, space)  # noqa: S307
    return f"{setup}\nassert {expression} == {value!r}".lstrip("\n")


def mbpp_rows() -> list[dict[str, Any]]:
    """The MBPP-style rows: each reference run here on each argument tuple to write its assert."""
    rows = []
    for i, (name, text, code, imports, calls) in enumerate(MBPP):
        space: dict[str, Any] = {"__name__": "reference"}
        exec(compile(code, f"<{name}>", "exec"), space)  # noqa: S102 - our own reference, trusted
        asserts, uses_math, uses_counter = [], False, False
        for args in calls:
            if isinstance(args, tuple):  # (setup, expression): asserted equal to its value here
                line = mbpp_raw_assert(*args, dict(space))
                asserts.append(line)
                continue
            value, error = None, None
            try:
                value = eval(f"{name}({args})", space)  # noqa: S307 - trusted reference and arguments
            except Exception as e:  # the reference's own documented error
                error = e
            line = mbpp_assert(name, args, value, error)
            uses_math |= "math.isclose" in line
            uses_counter |= line.split("==")[-1].strip().startswith("Counter(")
            asserts.append(line)
        test_imports = list(imports) + (["import math"] if uses_math else [])
        test_imports += ["from collections import Counter"] if uses_counter else []
        rows.append({"task_id": f"fidelity-mbpp/{i}", "text": text, "code": code, "test_list": asserts,
                     "test_imports": test_imports})
    return rows


# ------------------------------------------------------------------------------------------- stdio
# (name, text, code, [inputs: a string, or an input_gen dict])
def _gen(seed: int, n: int, lo: int = -10**9, hi: int = 10**9, layout: str = "count_line") -> dict[str, Any]:
    return {"seed": seed, "n": n, "lo": lo, "hi": hi, "layout": layout}


STDIO: list[tuple[str, str, str, list[Any]]] = [
    ("a_plus_b", "Read two integers, print their sum.",
     """\
a, b = map(int, input().split())
print(a + b)
""",
     ["1 2\n", "-5 5\n", "1000000000000 1\n"]),
    ("sum_n", "Read n, then n integers on one line; print their sum.",
     """\
n = int(input())
print(sum(map(int, input().split())))
""",
     ["3\n1 2 3\n", "1\n-7\n", _gen(1, 100_000)]),
    ("sum_n_fast", "Read n, then n integers (any layout); print their sum. Use sys.stdin.",
     """\
import sys
data = sys.stdin.buffer.read().split()
n = int(data[0])
print(sum(map(int, data[1:1 + n])))
""",
     ["3\n1\n2\n3\n", "2\n5 6\n", _gen(2, 100_000, layout="count_lines")]),
    ("max_min", "Read n and n integers; print the maximum and the minimum on one line.",
     """\
import sys

def main():
    data = sys.stdin.read().split()
    xs = list(map(int, data[1:]))
    print(max(xs), min(xs))


if __name__ == '__main__':
    main()
""",
     ["5\n3 1 4 1 5\n", "1\n0\n", _gen(3, 100_000)]),
    ("reverse_words", "Read a line and print its words in reverse order.",
     """\
print(' '.join(input().split()[::-1]))
""",
     ["hello world\n", "a\n", "  spaced   out words  \n"]),
    ("count_lines", "Read lines until end of input; print how many are not blank.",
     """\
import sys
print(sum(1 for line in sys.stdin if line.strip()))
""",
     ["a\n\nb\nc\n", "\n", "x\ny"]),
    ("echo_upper", "Print each input line in upper case, keeping the trailing spaces.",
     """\
import sys
for line in sys.stdin:
    print(line.rstrip('\\n').upper())
""",
     ["abc  \ndef\n", "x\n", "Mixed Case\n"]),
    ("fizzbuzz", "Read n; print FizzBuzz from 1 to n.",
     """\
n = int(input())
for i in range(1, n + 1):
    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)
""",
     ["15\n", "1\n", "100\n"]),
    ("sorted_numbers", "Read n and n integers; print them sorted, separated by spaces (a trailing space is fine).",
     """\
n = int(input())
xs = sorted(map(int, input().split()))
for x in xs:
    print(x, end=' ')
print()
""",
     ["4\n4 2 3 1\n", "1\n9\n", "6\n-1 -1 0 5 3 3\n"]),
    ("prefix_sums", "Read n integers and q queries l r (1-based, inclusive); print each range sum.",
     """\
import sys

input = sys.stdin.readline
n, q = map(int, input().split())
xs = list(map(int, input().split()))
pre = [0]
for x in xs:
    pre.append(pre[-1] + x)
out = []
for _ in range(q):
    l, r = map(int, input().split())
    out.append(pre[r] - pre[l - 1])
print('\\n'.join(map(str, out)))
""",
     ["5 3\n1 2 3 4 5\n1 5\n2 3\n4 4\n", "1 1\n7\n1 1\n"]),
    ("grid_paths", "Read r c and a grid of . and #; print the number of right/down paths mod 1e9+7.",
     """\
import sys
r, c = map(int, sys.stdin.readline().split())
g = [sys.stdin.readline().strip() for _ in range(r)]
dp = [[0] * c for _ in range(r)]
for i in range(r):
    for j in range(c):
        if g[i][j] == '#':
            continue
        if i == 0 and j == 0:
            dp[i][j] = 1
        else:
            dp[i][j] = ((dp[i - 1][j] if i else 0) + (dp[i][j - 1] if j else 0)) % (10 ** 9 + 7)
print(dp[-1][-1])
""",
     ["3 3\n...\n.#.\n...\n", "1 1\n.\n", "2 2\n.#\n#.\n"]),
    ("bfs_grid", "Read a grid with S, T, . and #; print the shortest path length from S to T, or -1.",
     """\
from collections import deque
import sys
lines = sys.stdin.read().split()
r, c = int(lines[0]), int(lines[1])
g = lines[2:2 + r]
for i in range(r):
    for j in range(c):
        if g[i][j] == 'S':
            s = (i, j)
dist = {s: 0}
q = deque([s])
ans = -1
while q:
    i, j = q.popleft()
    if g[i][j] == 'T':
        ans = dist[(i, j)]
        break
    for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        a, b = i + di, j + dj
        if 0 <= a < r and 0 <= b < c and g[a][b] != '#' and (a, b) not in dist:
            dist[(a, b)] = dist[(i, j)] + 1
            q.append((a, b))
print(ans)
""",
     ["3 4\nS..#\n.#..\n...T\n", "1 2\nST\n", "2 2\nS#\n#T\n"]),
    ("dijkstra", "Read a weighted directed graph (n m, then m edges u v w); print distances from 1 "
                 "(-1 if unreachable).",
     """\
import heapq
import sys
data = sys.stdin.read().split()
n, m = int(data[0]), int(data[1])
adj = [[] for _ in range(n + 1)]
for k in range(m):
    u, v, w = (int(x) for x in data[2 + 3 * k: 5 + 3 * k])
    adj[u].append((v, w))
INF = float('inf')
d = [INF] * (n + 1)
d[1] = 0
h = [(0, 1)]
while h:
    du, u = heapq.heappop(h)
    if du > d[u]:
        continue
    for v, w in adj[u]:
        if du + w < d[v]:
            d[v] = du + w
            heapq.heappush(h, (d[v], v))
print(' '.join(str(x) if x < INF else '-1' for x in d[1:]))
""",
     ["4 4\n1 2 1\n2 3 2\n1 3 5\n3 4 1\n", "2 0\n", "3 2\n1 2 7\n2 1 1\n"]),
    ("word_freq", "Read text; print each word and its count, most frequent first, ties alphabetically.",
     """\
import sys
from collections import Counter
c = Counter(sys.stdin.read().lower().split())
for w, k in sorted(c.items(), key=lambda t: (-t[1], t[0])):
    print(w, k)
""",
     ["the cat the dog\nThe end\n", "one\n", "b a b a c\n"]),
    ("float_avg", "Read n and n reals; print their average with 6 decimals.",
     """\
n = int(input())
xs = list(map(float, input().split()))
print(f'{sum(xs) / n:.6f}')
""",
     ["3\n1 2 4\n", "2\n0.1 0.2\n", "1\n-3.5\n"]),
    ("gcd_pairs", "Read t, then t lines a b; print gcd(a, b) for each.",
     """\
import math
t = int(input())
for _ in range(t):
    a, b = map(int, input().split())
    print(math.gcd(a, b))
""",
     ["3\n12 18\n7 5\n0 9\n", "1\n100 10\n"]),
    ("gcd_pairs_large", "Read n pairs; print the sum of their gcds.",
     """\
import sys, math
data = sys.stdin.buffer.read().split()
n = int(data[0])
print(sum(math.gcd(int(data[1 + 2 * i]), int(data[2 + 2 * i])) for i in range(n)))
""",
     ["2\n4 6\n9 3\n", _gen(4, 50_000, 1, 10**6, layout="pairs")]),
    ("palindrome_check", "Read t strings; print YES or NO for each: is it a palindrome?",
     """\
t = int(input())
for _ in range(t):
    s = input().strip()
    print('YES' if s == s[::-1] else 'NO')
""",
     ["3\nabba\nabc\na\n", "1\nxyzzyx\n"]),
    ("matrix_sum", "Read r c and an r x c matrix; print the row sums then the column sums.",
     """\
r, c = map(int, input().split())
m = [list(map(int, input().split())) for _ in range(r)]
print(*[sum(row) for row in m])
print(*[sum(col) for col in zip(*m)])
""",
     ["2 3\n1 2 3\n4 5 6\n", "1 1\n-4\n"]),
    ("primes_upto", "Read n; print the primes up to n on one line (sieve).",
     """\
n = int(input())
sieve = bytearray([1]) * (n + 1)
sieve[:2] = b'\\x00\\x00'
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i::i] = bytearray(len(range(i * i, n + 1, i)))
print(' '.join(str(i) for i in range(n + 1) if sieve[i]))
""",
     ["30\n", "2\n", "1\n"]),
    ("count_primes_big", "Read n; print how many primes are at most n.",
     """\
n = int(input())
sieve = bytearray([1]) * (n + 1)
sieve[:2] = b'\\x00\\x00'
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i::i] = bytearray(len(range(i * i, n + 1, i)))
print(sum(sieve))
""",
     ["10\n", "1000000\n"]),
    ("two_sum_exists", "Read n, a target and n integers; print YES if two of them sum to the target.",
     """\
import sys
data = sys.stdin.read().split()
n, t = int(data[0]), int(data[1])
seen = set()
ans = 'NO'
for x in map(int, data[2:2 + n]):
    if t - x in seen:
        ans = 'YES'
        break
    seen.add(x)
print(ans)
""",
     ["4 9\n2 7 11 15\n", "2 3\n1 1\n", "1 2\n1\n"]),
    ("lis", "Read n and n integers; print the length of the longest strictly increasing subsequence.",
     """\
import bisect
import sys
data = sys.stdin.read().split()
tails = []
for x in map(int, data[1:]):
    i = bisect.bisect_left(tails, x)
    if i == len(tails):
        tails.append(x)
    else:
        tails[i] = x
print(len(tails))
""",
     ["6\n10 9 2 5 3 7\n", "1\n5\n", _gen(5, 100_000)]),
    ("knapsack", "Read n W and n lines of weight value; print the best total value within weight W.",
     """\
n, W = map(int, input().split())
best = [0] * (W + 1)
for _ in range(n):
    w, v = map(int, input().split())
    for c in range(W, w - 1, -1):
        best[c] = max(best[c], best[c - w] + v)
print(best[W])
""",
     ["3 50\n10 60\n20 100\n30 120\n", "1 1\n2 10\n"]),
    ("balanced_brackets", "For each input line print YES if its brackets are balanced, else NO.",
     """\
import sys
for line in sys.stdin.read().splitlines():
    st = []
    ok = True
    for ch in line:
        if ch in '([{':
            st.append(ch)
        elif ch in ')]}':
            if not st or '([{'[')]}'.index(ch)] != st.pop():
                ok = False
                break
    print('YES' if ok and not st else 'NO')
""",
     ["([]){}\n(]\n((\n", "\n"]),
    ("caesar", "Read k and a line; print the line Caesar-shifted by k (letters only).",
     """\
k = int(input())
s = input()
out = []
for ch in s:
    if ch.isalpha():
        base = ord('A') if ch.isupper() else ord('a')
        out.append(chr((ord(ch) - base + k) % 26 + base))
    else:
        out.append(ch)
print(''.join(out))
""",
     ["3\nHello, World!\n", "26\nabc\n", "-1\nabc xyz\n"]),
    ("binary_repr", "Read t integers; print each in binary.",
     """\
t = int(input())
for _ in range(t):
    print(bin(int(input()))[2:])
""",
     ["3\n5\n0\n255\n", "1\n1024\n"]),
    ("union_find", "Read n m and m unions a b; print the number of connected components.",
     """\
import sys
data = sys.stdin.read().split()
n, m = int(data[0]), int(data[1])
parent = list(range(n + 1))

def find(x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x

for k in range(m):
    a, b = find(int(data[2 + 2 * k])), find(int(data[3 + 2 * k]))
    if a != b:
        parent[a] = b
print(sum(1 for v in range(1, n + 1) if find(v) == v))
""",
     ["5 3\n1 2\n2 3\n4 5\n", "3 0\n", "2 2\n1 2\n2 1\n"]),
    ("topo_sort", "Read n m and m edges a b (a before b); print a topological order (smallest first) or IMPOSSIBLE.",
     """\
import heapq
import sys
data = sys.stdin.read().split()
n, m = int(data[0]), int(data[1])
adj = [[] for _ in range(n + 1)]
deg = [0] * (n + 1)
for k in range(m):
    a, b = int(data[2 + 2 * k]), int(data[3 + 2 * k])
    adj[a].append(b)
    deg[b] += 1
h = [v for v in range(1, n + 1) if deg[v] == 0]
heapq.heapify(h)
order = []
while h:
    v = heapq.heappop(h)
    order.append(v)
    for w in adj[v]:
        deg[w] -= 1
        if deg[w] == 0:
            heapq.heappush(h, w)
print(' '.join(map(str, order)) if len(order) == n else 'IMPOSSIBLE')
""",
     ["4 3\n1 2\n3 2\n2 4\n", "2 2\n1 2\n2 1\n", "3 0\n"]),
    ("running_median", "Read n and n integers; print the median (lower) after each.",
     """\
import heapq
import sys
data = sys.stdin.read().split()
lo, hi, out = [], [], []
for x in map(int, data[1:]):
    heapq.heappush(lo, -x)
    heapq.heappush(hi, -heapq.heappop(lo))
    if len(hi) > len(lo):
        heapq.heappush(lo, -heapq.heappop(hi))
    out.append(-lo[0])
print('\\n'.join(map(str, out)))
""",
     ["5\n5 15 1 3 8\n", "1\n4\n", _gen(6, 5_000)]),
    ("dedupe_lines", "Print the distinct input lines in their first order.",
     """\
import sys
seen = set()
for line in sys.stdin.read().splitlines():
    if line not in seen:
        seen.add(line)
        print(line)
""",
     ["a\nb\na\nc\nb\n", "x\n"]),
    ("digit_sum_big", "Read a number of up to 10^5 digits; print its digit sum.",
     """\
s = input().strip()
print(sum(int(c) for c in s))
""",
     ["12345\n", "9" * 100_000 + "\n"]),
    ("big_multiply", "Read two big integers; print their product.",
     """\
a = int(input())
b = int(input())
print(a * b)
""",
     ["123456789123456789\n987654321987654321\n", "-3\n4\n"]),
    ("stack_machine", "Run push x / pop / top commands; print the result of each top (EMPTY when none).",
     """\
import sys
st = []
for line in sys.stdin:
    parts = line.split()
    if not parts:
        continue
    if parts[0] == 'push':
        st.append(parts[1])
    elif parts[0] == 'pop':
        if st:
            st.pop()
    else:
        print(st[-1] if st else 'EMPTY')
""",
     ["push 1\npush 2\ntop\npop\ntop\npop\ntop\n", "top\n"]),
    ("table_format", "Read n rows of name score; print them aligned: name left-justified to 10, score"
                     " right-justified to 5.",
     """\
import sys
rows = [l.split() for l in sys.stdin.read().splitlines()[1:] if l.strip()]
for name, score in rows:
    print(f'{name:<10}{score:>5}')
""",
     ["2\nalice 90\nbob 7\n", "1\nx 1\n"]),
    ("trailing_space_grid", "Read r c; print an r x c grid of '#' separated by spaces, each line ending in a space.",
     """\
r, c = map(int, input().split())
for _ in range(r):
    print('# ' * c)
""",
     ["2 3\n", "1 1\n"]),
    ("no_final_newline", "Read n; print 1..n separated by spaces without a final newline.",
     """\
import sys
n = int(input())
sys.stdout.write(' '.join(str(i) for i in range(1, n + 1)))
""",
     ["5\n", "1\n"]),
    ("crlf_input", "Read lines (possibly with Windows line ends); print the sum of the integers on each.",
     """\
import sys
for line in sys.stdin:
    if line.strip():
        print(sum(map(int, line.split())))
""",
     ["1 2\r\n3 4\r\n", "5\n"]),
    ("print_blank_lines", "Read t; print each of t lines reversed, with a blank line between them.",
     """\
t = int(input())
lines = [input() for _ in range(t)]
print('\\n\\n'.join(l[::-1] for l in lines))
""",
     ["2\nabc\nde\n", "1\nx\n"]),
    ("hex_convert", "Read hex numbers one a line; print each in decimal.",
     """\
import sys
for tok in sys.stdin.read().split():
    print(int(tok, 16))
""",
     ["ff\n10\n0\n", "DEADBEEF\n"]),
    ("date_weekday", "Read dates YYYY-MM-DD; print the weekday name of each.",
     """\
import sys
import datetime
for line in sys.stdin.read().split():
    print(datetime.date.fromisoformat(line).strftime('%A'))
""",
     ["2024-01-01\n2000-02-29\n", "1970-01-01\n"]),
    ("regex_emails", "Print every e-mail address found in the input, one a line.",
     """\
import re
import sys
for m in re.findall(r'[\\w.+-]+@[\\w-]+\\.[\\w.]+', sys.stdin.read()):
    print(m)
""",
     ["contact a.b@x.org or c+d@y.co.uk now\n", "none here\n"]),
    ("json_sum", "Read a JSON list of numbers; print its sum.",
     """\
import json
import sys
print(sum(json.load(sys.stdin)))
""",
     ["[1, 2, 3.5]\n", "[]\n"]),
    ("fraction_add", "Read fractions a/b one a line; print their exact sum.",
     """\
import sys
from fractions import Fraction
print(sum((Fraction(t) for t in sys.stdin.read().split()), Fraction(0)))
""",
     ["1/2\n1/3\n1/6\n", "3/4\n"]),
    ("numpy_stats", "Read n and n integers; print mean and max with numpy (mean to 3 decimals).",
     """\
import sys
import numpy as np
data = np.array(sys.stdin.read().split()[1:], dtype=np.int64)
print(f'{data.mean():.3f} {data.max()}')
""",
     ["4\n1 2 3 4\n", _gen(7, 100_000, 0, 10**6)]),
    ("itertools_perm", "Read n (at most 6); print every permutation of 1..n in lexicographic order.",
     """\
from itertools import permutations
n = int(input())
for p in permutations(range(1, n + 1)):
    print(*p)
""",
     ["3\n", "1\n", "6\n"]),
    ("recursion_depth", "Read n; print the sum 1..n computed recursively (n up to 5000).",
     """\
import sys
sys.setrecursionlimit(20000)

def s(n):
    return 0 if n == 0 else n + s(n - 1)

print(s(int(input())))
""",
     ["10\n", "5000\n"]),
    ("class_based", "Read operations on a bank account (deposit x / withdraw x); print the final "
                    "balance or ERROR on overdraft.",
     """\
import sys

class Account:
    def __init__(self):
        self.balance = 0

    def apply(self, op, x):
        if op == 'deposit':
            self.balance += x
        elif x > self.balance:
            raise ValueError
        else:
            self.balance -= x


acc = Account()
try:
    for line in sys.stdin:
        if line.strip():
            op, x = line.split()
            acc.apply(op, int(x))
    print(acc.balance)
except ValueError:
    print('ERROR')
""",
     ["deposit 10\nwithdraw 3\n", "withdraw 1\n", "deposit 5\ndeposit 5\nwithdraw 10\n"]),
    ("exit_early", "Read n; if n is negative print NEG and stop, else print n squared.",
     """\
import sys
n = int(input())
if n < 0:
    print('NEG')
    sys.exit(0)
print(n * n)
""",
     ["-3\n", "4\n"]),
    ("stderr_debug", "Read a b; print a*b (debug output may go to stderr).",
     """\
import sys
a, b = map(int, input().split())
print('debug', a, b, file=sys.stderr)
print(a * b)
""",
     ["6 7\n", "0 5\n"]),
    ("input_tokens_multi", "Read n then n numbers spread over any number of lines; print the count of evens.",
     """\
import sys
tokens = iter(sys.stdin.read().split())
n = int(next(tokens))
print(sum(int(next(tokens)) % 2 == 0 for _ in range(n)))
""",
     ["5\n1 2\n3\n4 5\n", "3\n2 4 6\n", _gen(8, 100_000, layout="count_lines")]),
    ("unicode_text", "Read a line of text; print its length in characters and its reverse.",
     """\
s = input()
print(len(s))
print(s[::-1])
""",
     ["héllo wörld\n", "日本語\n"]),
    ("sort_strings_big", "Read n and n integers; print the three largest, descending.",
     """\
import heapq
import sys
data = sys.stdin.buffer.read().split()
print(*heapq.nlargest(3, map(int, data[1:])))
""",
     ["5\n1 9 3 7 5\n", _gen(9, 100_000)]),
    ("open_zero", "Read n and n integers; print their sum (reading all of stdin with open(0)).",
     """\
data = open(0).read().split()
print(sum(map(int, data[1:])))
""",
     ["3\n1 2 3\n", _gen(10, 100_000)]),
    ("eof_loop", "Read lines until end of input; print each line's integer doubled (input() until EOFError).",
     """\
while True:
    try:
        line = input()
    except EOFError:
        break
    print(2 * int(line))
""",
     ["1\n2\n3\n", "5"]),
    ("exit_builtin", "Read n; print YES and stop (with exit()) when n is even, else NO.",
     """\
n = int(input())
if n % 2 == 0:
    print('YES')
    exit()
print('NO')
""",
     ["4\n", "3\n"]),
    ("readline_loop", "Read n and n integers one a line; print the count of positive ones.",
     """\
from sys import stdin
n = int(stdin.readline())
print(sum(1 for _ in range(n) if int(stdin.readline()) > 0))
""",
     ["3\n-1\n2\n3\n", _gen(11, 100_000, layout="count_lines")]),
    ("many_output_lines", "Read n; print the squares 1..n one a line (sys.stdout.write).",
     """\
import sys
n = int(input())
sys.stdout.write('\\n'.join(str(i * i) for i in range(1, n + 1)) + '\\n')
""",
     ["3\n", "5000\n"]),
    ("main_function_guard", "Read a line of integers; print them sorted descending, one per line.",
     """\
import sys


def solve(tokens):
    return sorted(map(int, tokens), reverse=True)


def main():
    print(*solve(sys.stdin.read().split()), sep='\\n')


if __name__ == '__main__':
    main()
""",
     ["3 1 2\n", "7\n"]),
]

# Expected-output variants a judge must accept: trailing spaces on lines, no final newline, CRLF.
_OUTPUT_VARIANTS = ("as_printed", "strip_final_newline", "add_trailing_spaces", "crlf")


def run_reference(code: str, stdin: str) -> str:
    """What the reference prints on `stdin`, run as a plain interpreter (trusted: our own code)."""
    proc = subprocess.run([sys.executable, "-c", code], input=stdin.encode(), capture_output=True, timeout=120,
                          check=True)
    return proc.stdout.decode()


def output_variant(text: str, variant: str) -> str:
    """The expected output written another way that the line-wise, trailing-whitespace-blind judge accepts."""
    if variant == "strip_final_newline":
        return text.rstrip("\n")
    if variant == "add_trailing_spaces":
        return "\n".join(line + "  " if line else line for line in text.split("\n"))
    if variant == "crlf":
        return text.replace("\n", "\r\n")
    return text


def stdio_rows() -> list[dict[str, Any]]:
    rows = []
    for i, (name, text, code, inputs) in enumerate(STDIO):
        cases = []
        for j, given in enumerate(inputs):
            stdin = expand_input(given) if isinstance(given, dict) else given
            printed = run_reference(code, stdin)
            output = output_variant(printed, _OUTPUT_VARIANTS[(i + j) % len(_OUTPUT_VARIANTS)])
            cases.append({"input_gen": given, "output": output} if isinstance(given, dict)
                         else {"input": given, "output": output})
        rows.append({"task_id": f"fidelity-stdio/{i}-{name}", "text": text, "code": code, "io": cases})
    return rows


def write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":  # a set's repr follows string hashing: fix it, so reruns match
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    mbpp, stdio = mbpp_rows(), stdio_rows()
    write_jsonl(MBPP_PATH, mbpp)
    write_jsonl(STDIO_PATH, stdio)
    print(f"{len(mbpp)} MBPP-style rows ({sum(len(r['test_list']) for r in mbpp)} asserts) -> {MBPP_PATH}")
    print(f"{len(stdio)} stdio rows ({sum(len(r['io']) for r in stdio)} cases) -> {STDIO_PATH}")


if __name__ == "__main__":
    main()
