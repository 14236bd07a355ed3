set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
t() { echo "== $1: $(( $(date +%s) - T0 )) s" | tee -a $OUT/steps.txt; }
timeout 570 python3 bench/exact_compile.py $OUT/s --phase speed --isolate --rounds 1 --pin 2-5 --candidates kernelize+exact,compile --prefills 1x512 --decode 1,8 --archs mistral > $OUT/speed.txt 2>&1
t "speed rc=$?"
grep -h "pinned_cpus" $OUT/speed.txt | cut -c1-400
cat $OUT/steps.txt
